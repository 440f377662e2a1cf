"""Goodput as the SLO scales (bench/replay/run.py): measured at every factor of the SLO and
reported per cell as the best policy at each scale and ours as a share of it."""

from bench.lib.matrix import MAIN_MODEL, WORKLOAD_BY_NAME, simulate
from bench.replay import run as replay_study


def test_each_run_measures_goodput_at_every_scale_of_the_slo():
    workload = WORKLOAD_BY_NAME["agentic"]
    result = simulate(workload.build(60, 0), "round_robin", MAIN_MODEL, "agentic")
    summary = replay_study.summarize(result, workload)
    values = [summary[key] for key in replay_study.SLO_KEYS]
    assert summary["goodput_slo_x1"] == summary["goodput_rps"]
    assert values == sorted(values)  # a looser SLO never loses a request


def row(policy, *goodputs):
    runs = [dict(zip(replay_study.SLO_KEYS, goodputs, strict=True))] * 2
    return replay_study.aggregate(policy, runs)


def test_the_report_names_the_best_at_each_scale_and_our_share_of_it():
    cell = {
        "policies": [
            row("least_load", 3.0, 5.0, 8.0, 9.0),
            row("cache_aware", 2.0, 6.0, 8.5, 9.0),
            row("lmetric", 2.4, 5.4, 8.5, 9.0),
        ]
    }
    lines = replay_study.slo_scaling_section({"agentic/60": cell})
    assert (
        "| agentic/60 | best | `least_load` | `cache_aware` | `cache_aware` | `least_load` |"
        in lines
    )
    assert "| agentic/60 | `lmetric` | 0.80 | 0.90 | 1.00 | 1.00 |" in lines
