"""The evaluation report's statistics and generator: intervals and ties against scipy,
goodput from known request fates, and the report written from a small fabricated matrix
(the summaries are made up: this tests the generator, not the policies)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from scipy import stats as scipy_stats

from bench.lib import stats
from bench.lib.matrix import MAIN_MODEL
from bench.replay import run as replay_study
from enginesim.replay import metrics
from enginesim.replay.simulator import RequestResult, SimResult

# ----------------------------------------------------------------- intervals and ties


def test_mean_ci_is_scipys_student_t_interval():
    values = [1.0, 1.3, 0.9, 1.15, 1.05]
    low, high = scipy_stats.t.interval(
        0.95, len(values) - 1, loc=np.mean(values), scale=scipy_stats.sem(values)
    )
    estimate = stats.mean_ci(values)
    assert estimate.mean == pytest.approx(np.mean(values))
    assert estimate.low == pytest.approx(low)
    assert estimate.high == pytest.approx(high)
    assert estimate.format(".2f") == f"{estimate.mean:.2f} ± {estimate.half_width:.2f}"


def test_one_value_has_no_interval_and_equal_values_a_zero_one():
    assert stats.mean_ci([2.0]).half_width == math.inf
    assert stats.mean_ci([2.0]).format(".1f") == "2.0"
    assert stats.mean_ci([2.0, 2.0, 2.0]).half_width == 0.0
    with pytest.raises(ValueError):
        stats.mean_ci([])


def test_paired_comparison_agrees_with_scipys_paired_t_test():
    # Seeds move both policies together: unpaired the intervals overlap, paired a is
    # clearly lower (better when lower is better).
    a = np.array([1.00, 1.50, 0.80, 1.20])
    b = a + np.array([0.10, 0.12, 0.09, 0.11])
    assert stats.mean_ci(a).overlaps(stats.mean_ci(b))
    assert scipy_stats.ttest_rel(a, b).pvalue < 0.05
    result = stats.compare(a, b, higher_is_better=False)
    assert result.outcome == "better"
    assert result.difference.mean == pytest.approx(-0.105)
    assert stats.compare(a, b, higher_is_better=True).outcome == "worse"
    # Differences whose sign changes from seed to seed: not significant, a tie.
    c = b + np.array([0.3, -0.25, 0.2, -0.3])
    assert scipy_stats.ttest_rel(c, b).pvalue >= 0.05
    assert stats.compare(c, b, higher_is_better=False).outcome == "tie"


def test_a_sure_but_tiny_difference_is_a_tie():
    b = np.array([10.0, 11.0, 12.0])
    assert stats.compare(b * 1.005, b, higher_is_better=True).outcome == "tie"
    assert stats.compare(b * 1.05, b, higher_is_better=True).outcome == "better"
    with pytest.raises(ValueError):
        stats.compare([1.0, 2.0], [1.0], higher_is_better=True)


def _comparison(outcome: str) -> stats.Comparison:
    return stats.Comparison(outcome, stats.Estimate(0.0, 0.0, 3), 0.0)  # type: ignore[arg-type]


def test_verdict_is_decided_by_the_first_metric_that_is_not_a_tie():
    better, worse, tie = _comparison("better"), _comparison("worse"), _comparison("tie")
    assert stats.verdict({"goodput": worse, "TTFT": better}) == ("behind", "goodput")
    assert stats.verdict({"goodput": better, "TPOT": worse}) == ("ahead", "goodput")
    assert stats.verdict({"goodput": tie, "decode": worse, "TTFT": better}) == (
        "behind",
        "decode",
    )
    assert stats.verdict({"goodput": tie, "TTFT": better, "TPOT": worse}) == ("ahead", "TTFT")
    assert stats.verdict({"goodput": tie, "TTFT": tie}) == ("tie", None)


# ----------------------------------------------------------------- goodput


def _request(
    index: int, arrival: float, ttft: float | None, tpot: float, out: int, status: str = "ok"
) -> RequestResult:
    first = None if ttft is None else arrival + ttft
    finish = None if first is None else first + tpot * (out - 1)
    return RequestResult(
        id=f"r{index}",
        arrival_s=arrival,
        prompt_tokens=100,
        output_tokens_asked=out,
        output_tokens=out if status == "ok" else 0,
        first_token_s=first,
        finish_s=finish,
        status=status,
    )


REQUESTS = [
    _request(0, 0.0, ttft=0.5, tpot=0.02, out=11),  # meets both
    _request(1, 1.0, ttft=0.5, tpot=0.08, out=11),  # TPOT over
    _request(2, 2.0, ttft=3.0, tpot=0.02, out=11),  # TTFT over
    _request(3, 3.0, ttft=1.0, tpot=0.0, out=1),  # one token: no TPOT, meets
    _request(4, 4.0, ttft=None, tpot=0.0, out=5, status="rejected"),  # misses
]
SLO = metrics.Slo(ttft_s=2.0, tpot_s=0.05)


def test_goodput_counts_requests_meeting_both_slos_per_second_of_arrivals():
    good = metrics.goodput(REQUESTS, SLO)
    assert good.met == 2
    assert good.attainment == pytest.approx(2 / 5)
    assert good.rps == pytest.approx(2 / 4.0)  # arrivals span 0 → 4 s
    assert metrics.goodput(REQUESTS[:1], SLO).rps is None  # one instant: no rate


def test_summary_carries_goodput_its_slo_and_output_throughput():
    result = SimResult(
        policy="p",
        requests=REQUESTS,
        instance_ids=["a", "b"],
        sample_times=np.zeros(0),
        pending_samples=np.zeros((0, 2)),
        busy_time=1.0,
        hotspot_events={},
        decision_reasons={},
    )
    summary = metrics.summarize(result, SLO)
    assert summary["goodput_rps"] == pytest.approx(0.5)
    assert summary["slo_attainment"] == pytest.approx(0.4)
    assert (summary["slo_ttft_s"], summary["slo_tpot_s"], summary["slo_met"]) == (2.0, 0.05, 2)
    makespan = REQUESTS[2].finish_s  # the last to finish; arrivals start at 0
    assert makespan is not None
    assert summary["throughput_tok_s"] == pytest.approx(34 / makespan)
    assert set(metrics.SUMMARY_KEYS) <= summary.keys()
    assert metrics.summarize(result)["slo_ttft_s"] == metrics.DEFAULT_SLO.ttft_s


# ----------------------------------------------------------------- the report

NOISE = (np.array([0.0, 0.02, -0.02]), np.array([0.01, -0.01, 0.0]))  # mean 0


def _runs(goodput: float, ttft: float, tpot: float, out: float, wobble: int = 0) -> list[Any]:
    """Three seeds' made-up summaries around the given means."""
    noise = NOISE[wobble]
    return [
        {
            "goodput_rps": goodput * (1 + n),
            "slo_attainment": min(1.0, goodput / 20 * (1 + n)),
            "ttft_mean_s": ttft * (1 + n),
            "ttft_p99_s": 4 * ttft * (1 + n),
            "tpot_mean_s": tpot * (1 + n),
            "tpot_p99_s": 3 * tpot * (1 + n),
            "throughput_tok_s": out * (1 + n),
            "hit_ratio": 0.5,
            "busy_fraction": 0.6,
            "rejected": 0,
        }
        for n in noise
    ]


def _matrix() -> dict[str, Any]:
    runs = {
        "round_robin": _runs(12.0, 3.0, 0.020, 4000),
        "least_load": _runs(14.0, 1.0, 0.020, 4000),
        "linear": _runs(18.0, 5.0, 0.021, 4000),  # a baseline past 2× least load's TTFT
        "lmetric": _runs(19.0, 0.50, 0.020, 4000),
        "smetric": _runs(19.0, 0.52, 0.020, 4000, wobble=1),
        # best TTFT, same goodput, decode wrecked: 3× least load's TPOT
        "predicted_ttft": _runs(19.0, 0.40, 0.060, 4000, wobble=1),
    }
    cell = {
        "workload": "agentic",
        "model": MAIN_MODEL,
        "load": 60,
        "rate_scale": 3.0,
        "requests": [4000, 4010, 3990],
        "cdf": "cdf_agentic_60.png",
        "lower_bound": {"policy": "lower_bound", "ttft_mean_s": 0.2, "ttft_p99_s": 0.7},
        "policies": [replay_study.aggregate(p, r) for p, r in runs.items()],
    }
    return {
        "command": "--quick",
        "machine": "test",
        "seeds": 3,
        "jobs": 18,
        "wall_s": 60.0,
        "planned_s": 60.0,
        "calibration": {},
        "cells": {"agentic/60": cell},
    }


def test_rows_hold_seed_means_intervals_and_the_runs():
    row = replay_study.aggregate("lmetric", _runs(19.0, 0.5, 0.02, 4000))
    values = [r["ttft_mean_s"] for r in row["runs"]]
    assert row["ttft_mean_s"] == pytest.approx(np.mean(values))
    assert row["ci"]["ttft_mean_s"] == pytest.approx(stats.mean_ci(values).half_width)
    assert "tier_gb" not in row  # measures no run has are left out


def test_report_judges_goodput_first_and_lists_invariant_breaches(tmp_path):
    data = _matrix()
    replay_study.analyse(data)
    cell = data["cells"]["agentic/60"]
    judged = cell["judgements"]
    # lmetric and smetric are indistinguishable over the seeds
    assert judged["smetric"]["against"] == "lmetric"
    assert judged["smetric"]["verdict"] == "tie"
    # predicted_ttft wins TTFT by wrecking decode: it is not the best, and it is behind
    assert judged["lmetric"]["against"] == "smetric"
    assert judged["predicted_ttft"]["against"] == "lmetric"
    assert (judged["predicted_ttft"]["verdict"], judged["predicted_ttft"]["on"]) == (
        "behind",
        "decode",
    )
    assert (judged["round_robin"]["verdict"], judged["round_robin"]["on"]) == ("behind", "goodput")
    # invariant v2, seed by seed: the best baseline on every seed is linear (goodput 18);
    # predicted_ttft's TPOT 0.060 × (1.01, 0.99, 1) against linear's 0.021 × (1, 1.02, 0.98)
    predicted = cell["invariant"]["predicted_ttft"]
    assert predicted["best_baselines"] == ["linear"]
    assert predicted["breaches"] == [
        "seed 0: mean TPOT 2.89× linear's",
        "seed 1: mean TPOT 2.77× linear's",
        "seed 2: mean TPOT 2.92× linear's",
    ]
    assert predicted["seeds_breaking"] == 3
    assert not cell["invariant"]["lmetric"]["breaches"]
    # round robin's goodput 12 against least load's 14: 0.857 on every seed
    assert cell["invariant"]["round_robin"]["seeds_breaking"] == 3

    replay_study.report(tmp_path, data)
    text = (tmp_path / "README.md").read_text()
    assert "## The never-collapse invariant" in text
    assert (
        "| agentic/60 | 1.317 | 0.08 | 2.92 | 3/3 | seed 0: mean TPOT 2.89× linear's; "
        "seed 1: mean TPOT 2.77× linear's; seed 2: mean TPOT 2.92× linear's |"
    ) in text
    assert "`lmetric`\n\nHolds on 3 of 3 seeds, in 1 of 1 cells on every seed." in text
    assert "| `linear` | 1 | 3 | agentic/60 (3) |" in text
    assert "tie (`lmetric`)" in text
    assert "**behind** on decode (`lmetric`)" in text
    assert "| `predicted_ttft` (ours) | 1 | 0 | 0 | 0 | 1 | 0 | 1 | 0 | 0 | 1 |" in text
    assert stats.rule_text() in text
    # every table row has as many cells as its header
    for table in (t for t in text.split("\n\n") if t.startswith("| ")):
        widths = {line.count(" | ") for line in table.splitlines() if not line.startswith("|--")}
        assert len(widths) == 1, table
