"""Invariant v2 (enginesim/replay/invariant.py) on hand-made per-seed summaries: the goodput
leg against the better reference, TTFT and TPOT against the best baseline of the seed, a
missing value failing, and every breaking seed reported."""

from enginesim.replay import invariant


def run(goodput, ttft, tpot, out=1000.0):
    return {
        "goodput_rps": goodput,
        "ttft_mean_s": ttft,
        "tpot_mean_s": tpot,
        "throughput_tok_s": out,
    }


def test_goodput_leg_uses_the_better_reference():
    seed = {
        "round_robin": run(10.0, 1.0, 0.02),
        "least_load": run(12.0, 1.0, 0.02),
        "lmetric": run(11.3, 1.0, 0.02),  # 11.3 < 0.95 × 12 = 11.4
    }
    result = invariant.check("lmetric", seed)
    assert result.breaches == ("goodput 0.942× the better reference's",)
    seed["lmetric"] = run(11.4, 1.0, 0.02)
    assert invariant.check("lmetric", seed).holds


def test_latency_legs_compare_with_the_highest_goodput_baseline_not_a_collapsed_reference():
    """least load collapses (TTFT 50 s): the ceiling is the best baseline's, cache_aware's."""
    seed = {
        "round_robin": run(8.0, 2.0, 0.02),
        "least_load": run(4.0, 50.0, 0.02),
        "cache_aware": run(10.0, 1.0, 0.03),
        "lmetric": run(10.0, 2.5, 0.05),
    }
    result = invariant.check("lmetric", seed)
    assert result.best_baseline == "cache_aware"
    assert result.ttft_ratio == 2.5 and result.tpot_ratio == 0.05 / 0.03
    assert result.breaches == ("mean TTFT 2.50× cache_aware's",)  # TPOT 1.67×: within 2×


def test_equal_goodput_baselines_are_ranked_by_mean_ttft():
    seed = {
        "round_robin": run(10.0, 3.0, 0.02),
        "least_load": run(10.0, 1.0, 0.02),
        "lmetric": run(10.0, 2.5, 0.02),
    }
    result = invariant.check("lmetric", seed)
    assert result.best_baseline == "least_load"
    assert result.breaches == ("mean TTFT 2.50× least_load's",)


def test_a_missing_value_fails_never_passes():
    seed = {
        "round_robin": run(10.0, 1.0, 0.02),
        "least_load": run(10.0, 1.0, 0.02),
        "lmetric": {"goodput_rps": 10.0, "ttft_mean_s": None, "tpot_mean_s": float("nan")},
    }
    assert invariant.check("lmetric", seed).breaches == (
        "mean TTFT not measured (policy or best baseline)",
        "mean TPOT not measured (policy or best baseline)",
    )
    no_reference = {"round_robin": run(10.0, 1.0, 0.02), "lmetric": run(10.0, 1.0, 0.02)}
    assert invariant.check("lmetric", no_reference).breaches == (
        "goodput not measured (policy or reference)",
    )


def test_every_breaking_seed_is_listed_while_the_mean_would_pass():
    """Seed 1 alone breaks the goodput leg; the seed means (10.5 vs 11) would pass it."""
    runs = {
        "round_robin": [run(10.0, 1.0, 0.02)] * 3,
        "least_load": [run(11.0, 1.0, 0.02)] * 3,
        "lmetric": [run(11.0, 1.0, 0.02), run(10.0, 1.0, 0.02), run(10.5, 1.0, 0.02)],
    }
    record = invariant.worst(invariant.check_seeds("lmetric", runs))
    assert record["breaches"] == ["seed 1: goodput 0.909× the better reference's"]
    assert (record["seeds_breaking"], record["seeds"]) == (1, 3)
    assert record["goodput_ratio"] == 10.0 / 11.0


def test_a_seed_a_reference_did_not_run_fails():
    runs = {
        "round_robin": [run(10.0, 1.0, 0.02)],
        "least_load": [run(10.0, 1.0, 0.02)],
        "lmetric": [run(10.0, 1.0, 0.02), run(10.0, 1.0, 0.02)],
    }
    record = invariant.worst(invariant.check_seeds("lmetric", runs))
    assert record["breaches"] == [
        "seed 1: goodput not measured (policy or reference)",
        "seed 1: mean TTFT not measured (policy or best baseline)",
        "seed 1: mean TPOT not measured (policy or best baseline)",
    ]
