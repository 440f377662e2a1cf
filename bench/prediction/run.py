"""How well predicted_ttft predicts, with and without its online correction.

For every request a ``predicted_ttft`` decision placed, the simulator keeps the decision's
prediction (``RequestResult.predicted_ttft_s``: admission wait and learned correction
included) beside the TTFT the request then had. Per regime of the robustness suite
(homogeneous engines, slow and jittered and mis-modelled ones, the long-output burst) and
per seed, this bench reports:

* MAPE: mean of |predicted − measured| ÷ measured;
* p90 |error|: the 90th percentile of |predicted − measured|, seconds;
* bias: mean of predicted − measured, seconds (negative: the model is optimistic);
* the policy's mean TTFT and goodput, since a better prediction is worth having only if it
  routes better.

``correction off`` is the same policy with ``correction`` false: the cost model alone.

With ``--live`` it also measures the error live against enginesim: for homogeneous and for
mis-modelled engines, with the correction on and off, a fresh devharness.Fleet of enginesim
instances in slow motion behind a standalone router replays a slice of the Mooncake
conversation trace (``bench/live_vs_replay/run.py``), and the router's own decisions (their
prediction, from ``/admin/state``) are joined with the TTFT it measured; the same slice
replayed in the simulator is the row beside it. It needs an otherwise idle machine (the
engines run in wall time) and about 15 minutes.

    python -m bench.prediction.run          # → bench/prediction/README.md
    python -m bench.prediction.run --live   # the same, with the live section
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from bench.lib import live as live_stack
from bench.lib.regimes import SLO, SLOW_SPEEDS, Regime
from bench.lib.stats import mean_ci
from enginesim.replay import metrics
from enginesim.replay.simulator import Simulator

REGIMES = (
    Regime("homogeneous", "conversation", {"high": 1.0}),
    Regime(
        "slow_and_jittered",
        "conversation",
        {"high": 1.0},
        variation={"speeds": SLOW_SPEEDS, "step_jitter": 0.1},
    ),
    Regime(
        "mis_modelled",
        "conversation",
        {"high": 1.0},
        variation={"perturb": 0.2, "step_jitter": 0.1},
    ),
    Regime("long_output", "long_output", {"high": 1.0}),
)
VARIANTS = {"correction on": {}, "correction off": {"correction": False}}


def _run(job: tuple[Regime, str, int]) -> tuple[str, str, dict[str, float]]:
    regime, variant, seed = job
    records = regime.records(regime.loads["high"], seed)
    config = regime.config(seed, {"predicted_ttft": VARIANTS[variant]})
    result = Simulator(records, "predicted_ttft", config).run()
    done = [
        r
        for r in result.requests
        if r.status == "ok" and r.predicted_ttft_s is not None and r.first_token_s is not None
    ]
    predicted = np.array([r.predicted_ttft_s for r in done], dtype=float)
    measured = np.array([metrics.ttft_of(r) for r in done])
    error = predicted - measured
    summary = metrics.summarize(result, SLO)
    return (
        regime.name,
        variant,
        {
            "mape": float(np.mean(np.abs(error) / np.maximum(measured, 1e-9))),
            "p90_abs_s": float(np.percentile(np.abs(error), 90)),
            "bias_s": float(error.mean()),
            "ttft_mean_s": summary["ttft_mean_s"],
            "goodput_rps": summary["goodput_rps"],
        },
    )


def table(results: dict[tuple[str, str], list[dict[str, float]]]) -> list[str]:
    lines = [
        "| regime | prediction | MAPE | p90 \\|error\\| s | bias s | mean TTFT s | goodput req/s |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for (regime, variant), runs in results.items():

        def est(key: str, spec: str, runs: list[dict[str, float]] = runs) -> str:
            return mean_ci([run[key] for run in runs]).format(spec)

        lines.append(
            f"| {regime} | {variant} | {est('mape', '.2f')} | {est('p90_abs_s', '.3f')} | "
            f"{est('bias_s', '.3f')} | {est('ttft_mean_s', '.3f')} | "
            f"{est('goodput_rps', '.2f')} |"
        )
    return lines


LIVE_SLICE = ["--start", "1700", "--end", "1800"]  # 358 requests, ~75% busy
LIVE_FLEETS = {"homogeneous": [], "mis_modelled": ["--perturb", "0.2", "--step-jitter", "0.1"]}


def live_rows() -> list[str]:
    """The live section: per fleet and correction, the live and replayed prediction error."""
    lines = [
        "| engines | prediction | side | n | MAPE | p90 \\|error\\| s | bias s | mean TTFT s |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    with tempfile.TemporaryDirectory(prefix="prediction_live_") as tmp:
        for fleet, fleet_args in LIVE_FLEETS.items():
            for variant, params in VARIANTS.items():
                argv = ["--policies", "predicted_ttft", *LIVE_SLICE, *fleet_args]
                argv += ["--policy-params", json.dumps({"predicted_ttft": params})]
                args = live_stack.build_parser(__doc__.split("\n\n")[0]).parse_args(argv)
                work = Path(tmp) / f"{fleet}_{variant.replace(' ', '_')}"
                work.mkdir()
                live, replay = live_stack.live_and_replay(args, work)
                for side, result in (("live", live), ("replay", replay)):
                    row = result["predicted_ttft"]
                    error = row["prediction"]
                    lines.append(
                        f"| {fleet} | {variant} | {side} | {error['n']} | {error['mape']:.2f} | "
                        f"{error['p90_abs_s']:.3f} | {error['bias_s']:+.3f} | "
                        f"{row['ttft']['mean']:.3f} |"
                    )
    return lines


def live_section() -> list[str]:
    args = " ".join(LIVE_SLICE)
    return [
        "## Live against enginesim",
        "",
        "16 × H20 Qwen2-7B enginesim instances in slow motion (time scale 2) behind one "
        "router, the Mooncake conversation trace's slice "
        f"`{args}` at rate scale 1.25 (one run each; `bench/live_vs_replay/run.py`). The "
        "router's coefficients are derived for the fleet and stretched by the time scale; "
        "live rows join each decision's prediction with the TTFT the router measured, "
        "replay rows are the same slice in the simulator. Seconds are simulated seconds. "
        "mis_modelled: every engine's cost coefficients perturbed by up to ±20% and a 10% "
        "per-step jitter (the same fleet seed live and in the replay).",
        "",
        *live_rows(),
        "",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "README.md")
    parser.add_argument("--live", action="store_true", help="add the live section (~15 min)")
    args = parser.parse_args(argv)
    jobs = [
        (regime, variant, seed)
        for regime in REGIMES
        for variant in VARIANTS
        for seed in range(1, args.seeds + 1)
    ]
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for regime, variant, row in pool.map(_run, jobs):
            results.setdefault((regime, variant), []).append(row)
    lines = [
        "# predicted_ttft's prediction error",
        "",
        f"Generated by `python -m bench.prediction.run`: {args.seeds} seeds per row, mean ± 95% "
        "Student-t interval over seeds; regimes as in `bench/robustness/run.py` (16 × H20, "
        "Qwen2-7B; the conversation regimes replay the first 600 s of the Mooncake "
        "conversation trace). The prediction excludes the engine's fixed per-request "
        "overhead (the same on every instance), so the uncorrected model is optimistic "
        "by about that much on an idle engine.",
        "",
        *table(results),
        "",
        *(live_section() if args.live else ["Live section: run with `--live`.", ""]),
    ]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
