"""The tuning and evaluation splits (bench/lib/splits.py) never share a request, and the
tuning script's tie rule (bench/tuning/run.py) moves a default only on a win across the
tuning split."""

import json

import pytest

from bench.lib import matrix, splits
from bench.tuning import run as tuning
from enginesim.replay.traces import read_trace


@pytest.mark.parametrize("workload", ["azure_code", "azure_conv", "conversation", "synthetic"])
def test_trace_windows_of_the_two_splits_lie_in_disjoint_halves(workload):
    spec = matrix.WORKLOAD_BY_NAME[workload]
    assert spec.trace is not None
    trace = read_trace(spec.trace)
    middle = (trace[0].arrival_s + trace[-1].arrival_s) / 2
    for replicate in range(5):
        start, end = splits.window(trace, spec, "tuning", replicate)
        assert trace[0].arrival_s <= start < end <= middle
        start, end = splits.window(trace, spec, "evaluation", replicate)
        assert middle <= start < end <= trace[-1].arrival_s


def test_generated_workloads_draw_other_seeds_for_tuning():
    evaluation = splits.records("agentic", "evaluation", 1, 50)
    assert evaluation == matrix.WORKLOAD_BY_NAME["agentic"].build(50, 1)  # the matrix's
    assert splits.records("agentic", "tuning", 1, 50) != evaluation


def test_the_fleets_of_the_two_splits_are_disjoint():
    assert not set(splits.FLEETS["tuning"]) & set(splits.FLEETS["evaluation"])


def runs(*goodputs):
    return [{"goodput_rps": g} for g in goodputs]


DEFAULT = json.dumps({"batch_offset": 1.0})
OTHER = json.dumps({"batch_offset": 4.0})


def results(other_by_cell):
    """Three cells; the default's goodput 10, 10.2, 9.8 on the three seeds of each."""
    return {
        key: {DEFAULT: runs(10.0, 10.2, 9.8), OTHER: runs(*other)}
        for key, other in other_by_cell.items()
    }


def test_a_candidate_better_in_most_cells_and_worse_in_none_moves_the_default():
    # +10% on every seed in a and b (better); c within 1% (a tie)
    chosen, judged = tuning.choose(
        results({"a": (11, 11.22, 10.78), "b": (11, 11.22, 10.78), "c": (10.05, 10.2, 9.8)}),
        DEFAULT,
        [DEFAULT, OTHER],
    )
    assert chosen == OTHER
    assert (judged[OTHER]["better"], judged[OTHER]["tie"], judged[OTHER]["worse"]) == (2, 1, 0)


def test_a_candidate_worse_in_one_cell_or_better_in_a_few_does_not():
    worse_once = results({"a": (11, 11.22, 10.78), "b": (11, 11.22, 10.78), "c": (9, 9.2, 8.8)})
    assert tuning.choose(worse_once, DEFAULT, [DEFAULT, OTHER])[0] == DEFAULT
    few = results({"a": (11, 11.22, 10.78), "b": (10, 10.2, 9.8), "c": (10, 10.2, 9.8)})
    chosen, judged = tuning.choose(few, DEFAULT, [DEFAULT, OTHER])
    assert chosen == DEFAULT and judged[OTHER]["better"] == 1


def test_only_a_matrix_default_can_be_tuned():
    assert tuning.tunable("lmetric.batch_offset") == ("lmetric", ["batch_offset"], 1.0)
    with pytest.raises(ValueError, match="not a default with provenance 'matrix'"):
        tuning.tunable("lmetric.prefill_term")


def test_every_matrix_default_has_values_to_be_tuned_with():
    """A default of provenance ``matrix`` is chosen by the tuning script, so each one must
    be in its table, its current value among the values tried."""
    from router_worker.routing import REGISTRY
    from router_worker.routing.provenance import params_provenance

    defaults = {
        f"{kind}.{path}"
        for kind, policy in REGISTRY.items()
        for path, provenance in params_provenance(policy.Params).items()
        if provenance is not None and provenance.provenance == "matrix"
    }
    assert defaults == set(tuning.TUNABLES)
    for name, values in tuning.TUNABLES.items():
        assert tuning.tunable(name)[2] in values, name
