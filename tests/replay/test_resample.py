"""Seeds that resample: a recorded trace re-timed within bins, windows at seeded starts, and
engines with seeded jitter, so that no seed replays exactly what another did."""

import numpy as np
import pytest

from bench.lib import matrix
from enginesim.replay.traces import TraceRecord, retime


def trace(arrivals):
    return [TraceRecord(i, t, 100 + i, 10) for i, t in enumerate(arrivals)]


def test_retime_keeps_requests_order_and_count_per_bin():
    records = trace([0.0, 0.0, 0.0, 12.0, 31.0, 31.0, 95.0])
    moved = retime(records, seed=3, bin_s=30.0)
    assert [r.input_tokens for r in moved] == [r.input_tokens for r in records]
    times = np.array([r.arrival_s for r in moved])
    assert np.all(np.diff(times) >= 0)
    assert np.histogram(times, bins=[0, 30, 60, 90, 120])[0].tolist() == [4, 2, 0, 1]
    assert [r.index for r in moved] == list(range(7))


def test_retime_depends_on_the_seed_only():
    records = trace([0.0, 0.0, 0.0, 12.0, 31.0])
    first = [r.arrival_s for r in retime(records, seed=1)]
    assert first == [r.arrival_s for r in retime(records, seed=1)]
    assert first != [r.arrival_s for r in retime(records, seed=2)]


def test_retime_refuses_a_bin_that_is_not_positive():
    with pytest.raises(ValueError, match="bin_s must be positive"):
        retime(trace([0.0]), seed=0, bin_s=0)


def test_window_start_is_seeded_and_leaves_a_whole_window():
    records = trace(np.linspace(0.0, 3000.0, 50).tolist())
    starts = [matrix.window_start(records, 1200.0, r) for r in range(5)]
    assert all(0.0 <= s <= 1800.0 for s in starts)
    assert len(set(starts)) == 5
    assert matrix.window_start(records, None, 3) == 0.0  # the whole trace
    assert matrix.window_start(records, 5000.0, 3) == 0.0  # longer than the trace


def test_each_replicate_resamples_the_engines_and_a_recorded_trace():
    configs = [matrix.config_for(matrix.MAIN_MODEL, "round_robin", "azure_code", r) for r in (0, 1)]
    assert configs[0].variation.step_jitter == matrix.ENGINE_JITTER > 0
    assert configs[0].variation.seed != configs[1].variation.seed
    code = matrix.WORKLOAD_BY_NAME["azure_code"]
    first, second = code.build(200, 0), code.build(200, 1)
    assert [r.input_tokens for r in first] != [r.input_tokens for r in second]  # other window
    conversation = matrix.WORKLOAD_BY_NAME["conversation"]
    a, b = conversation.build(200, 0), conversation.build(200, 1)
    assert [r.hash_ids for r in a] == [r.hash_ids for r in b]  # same requests, in order
    assert [r.arrival_s for r in a] != [r.arrival_s for r in b]  # at other times


def test_robustness_regimes_resample_the_trace_and_jitter_every_fleet():
    from bench.lib import regimes

    one, two = regimes.conversation(1.0, 1), regimes.conversation(1.0, 2)
    assert [r.input_tokens for r in one] != [r.input_tokens for r in two]
    assert all(r.arrival_s < regimes.CONVERSATION_WINDOW_S for r in one)
    by_name = {r.name: r for r in regimes.regimes()}
    assert by_name["mixed_gpus"].config(1).variation.step_jitter == matrix.ENGINE_JITTER
    assert by_name["heterogeneous"].config(1).variation.step_jitter == 0.1  # its own
