"""The robustness report applies the tie rule: every policy it cannot tell from the best
cell's goodput is marked with it, not only the one with the highest mean."""

from bench.robustness.run import cell_table, tied_with_best


def runs(*goodputs):
    return [
        {
            "seed": seed,
            "goodput_rps": g,
            "slo_attainment": 1.0,
            "ttft_mean_s": 1.0,
            "ttft_p99_s": 2.0,
            "tpot_mean_s": 0.02,
            "tpot_p99_s": 0.03,
            "throughput_tok_s": 100.0,
        }
        for seed, g in enumerate(goodputs, start=1)
    ]


CELL = {
    "a": runs(10.0, 10.2, 9.8),  # the best mean
    "b": runs(10.05, 10.1, 9.85),  # 0.0 mean difference within 1%: a tie
    "c": runs(9.0, 9.18, 8.82),  # 10% lower on every seed: behind
    "d": runs(12.0, 8.0, 9.5),  # mean 9.83 but the seeds disagree: a tie
}


def test_the_policies_tied_with_the_best_are_marked():
    assert tied_with_best(CELL) == {"a", "b", "d"}
    table = "\n".join(cell_table(CELL))
    assert "| **a** |" in table and "| **b** |" in table and "| **d** |" in table
    assert "| c |" in table
