"""LMetric's load term across fleets: the batch offset c swept, beside the decode-step form.

LMetric scores ``P-token × load``. With ``load_term: batch_size`` the load is ``BS + c``;
c = 0 is the paper's form, the default was chosen on the matrix's one fleet. With
``load_term: decode_step`` the load is the time of the decode step the request joins,
from the fleet's decode costs (what the control plane derives from the cluster's GPU and
model): a fixed part, a part per running request and the KV reads of their contexts.
This study replays, on five fleets, the robustness suite's two workloads (the long-output
burst over private traffic, and the Mooncake conversation window) at two loads each, for
c ∈ {0, 1, 4, 16, 48, 128} and the decode-step form, beside round robin and least load
(for the never-collapse invariant). Loads are set per fleet in proportion to its
capacity, so that every fleet is as busy as the reference fleet at the same load name:
the conversation trace (prefill-bound) by the fleet's prefill rate, the burst
(decode-bound) by its decode step rate, both from enginesim's cost model.

A variant's fleet score is the mean over the fleet's four cells of its goodput ÷ the best
variant's goodput in that cell (seed means), so each cell counts the same.

    python -m bench.load_term.run        # → bench/load_term/
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.lib.regimes import (
    BURST,
    BURST_LOADS,
    CONVERSATION_LOADS,
    CONVERSATION_WINDOW_S,
    SLO,
    Regime,
    estimates,
    invariant_rows,
    run_suite,
)
from enginesim.replay.policy_costs import derive_coefficients

REFERENCE_FLEET = ("h20", "qwen2-7b")
FLEETS = (
    REFERENCE_FLEET,
    ("h100", "llama-3.1-8b"),
    ("a100", "qwen3-8b"),
    ("l40s", "qwen2.5-7b"),
    ("h20", "qwen3-32b"),
)
OFFSETS = (0, 1, 4, 16, 48, 128)
STEP = "decode_step"
REFERENCES = ("round_robin", "least_load")
WITHIN = 0.03  # the derived form's goal: within 3% of the best variant's fleet score


def variants() -> dict[str, tuple[str, dict[str, Any]]]:
    out: dict[str, tuple[str, dict[str, Any]]] = {
        f"c={c}": ("lmetric", {"load_term": "batch_size", "batch_offset": float(c)})
        for c in OFFSETS
    }
    out[STEP] = ("lmetric", {"load_term": "decode_step"})
    return out


def capacity(gpu: str, model: str) -> dict[str, float]:
    """The fleet's prefill rate and decode step rate relative to the reference fleet's."""
    here, ref = derive_coefficients(gpu, model), derive_coefficients(*REFERENCE_FLEET)
    return {
        "conversation": float(here["prefill_tps"]) / float(ref["prefill_tps"]),
        "long_output": float(ref["min_step_s"]) / float(here["min_step_s"]),
    }


def fleet_regimes(gpu: str, model: str) -> list[Regime]:
    factor = capacity(gpu, model)
    fleet = {"gpu": gpu, "model": model}
    return [
        Regime(
            f"{workload}@{gpu}+{model}",
            workload,
            {name: round(scale * factor[workload], 3) for name, scale in loads.items()},
            fleet,
        )
        for workload, loads in (("long_output", BURST_LOADS), ("conversation", CONVERSATION_LOADS))
    ]


def goodput_means(cell: dict[str, list[dict[str, Any]]]) -> dict[str, float]:
    return {name: estimates(runs, "goodput_rps").mean for name, runs in cell.items()}


def fleet_scores(cells: dict[str, Any], names: Sequence[str], fleet: str) -> dict[str, float]:
    """Per variant, the mean over the fleet's cells of goodput ÷ the cell's best variant's."""
    mine = [cell for key, cell in cells.items() if key.split("/")[0].endswith("@" + fleet)]
    ratios: dict[str, list[float]] = {name: [] for name in names}
    for cell in mine:
        good = goodput_means(cell)
        best = max(good[name] for name in names)
        for name in names:
            ratios[name].append(good[name] / best if best > 0 else 1.0)
    return {name: sum(values) / len(values) for name, values in ratios.items()}


def score_table(cells: dict[str, Any], names: Sequence[str]) -> tuple[list[str], list[str]]:
    """The fleet-score table and the fleets where decode_step misses the best by > WITHIN."""
    lines = [
        "| fleet | " + " | ".join(names) + " | best | decode_step ÷ best |",
        "|---|" + "---:|" * (len(names) + 2),
    ]
    misses = []
    present = {key.split("/")[0].split("@")[1] for key in cells}
    for fleet in (f"{gpu}+{model}" for gpu, model in FLEETS):
        if fleet not in present:
            continue
        scores = fleet_scores(cells, names, fleet)
        best = max(scores, key=lambda name: scores[name])
        ratio = scores[STEP] / scores[best]
        if ratio < 1 - WITHIN:
            misses.append(fleet)
        row = " | ".join(f"**{scores[n]:.3f}**" if n == best else f"{scores[n]:.3f}" for n in names)
        lines.append(f"| {fleet} | {row} | {best} | {ratio:.3f} |")
    return lines, misses


def cell_table(cell: dict[str, list[dict[str, Any]]]) -> list[str]:
    good = goodput_means(cell)
    best = max(good.values())
    lines = [
        "| variant | goodput req/s | SLO met | mean TTFT s | p99 TTFT s | mean TPOT s | "
        "output tok/s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, runs in cell.items():
        label = f"**{name}**" if good[name] == best else name
        lines.append(
            f"| {label} | {estimates(runs, 'goodput_rps').format('.2f')} | "
            f"{estimates(runs, 'slo_attainment').format('.2f')} | "
            f"{estimates(runs, 'ttft_mean_s').format('.3f')} | "
            f"{estimates(runs, 'ttft_p99_s').format('.2f')} | "
            f"{estimates(runs, 'tpot_mean_s').format('.4f')} | "
            f"{estimates(runs, 'throughput_tok_s').format('.0f')} |"
        )
    return lines


SLO_OUT_OF_REACH = 0.5  # a cell whose best variant meets the SLO for fewer requests than this


def out_of_reach(cells: dict[str, Any]) -> list[str]:
    """Cells where no variant meets the SLO for half the requests: goodput cannot rank there."""
    return [
        key
        for key, cell in cells.items()
        if max(estimates(runs, "slo_attainment").mean for runs in cell.values()) < SLO_OUT_OF_REACH
    ]


def report(out: Path, data: dict[str, Any]) -> None:
    cells, names = data["cells"], data["variants"]
    scores, misses = score_table(cells, names)
    breaches = [row for row in data["invariant"] if row["breaches"] and row["own"]]
    lines = [
        "# LMetric's load term across fleets",
        "",
        f"Generated by `python -m bench.load_term.run` in {data['wall_s'] / 60:.1f} min, "
        f"{data['seeds']} seeds per cell (mean ± 95% Student-t interval over seeds). Goodput: "
        f"requests per second meeting TTFT ≤ {SLO.ttft_s:g} s and TPOT ≤ {SLO.tpot_s:g} s "
        "together. `c=N`: load term BS + N (c=0 is the paper's form); `decode_step`: the time "
        "of the decode step the request joins, from the fleet's derived decode costs.",
        "",
        "## Fleet scores",
        "",
        "Mean over the fleet's four cells of goodput ÷ the cell's best variant (seed means); "
        "the best per fleet in bold.",
        "",
        *scores,
        "",
        f"decode_step within {WITHIN:.0%} of the best variant on "
        f"{len(FLEETS) - len(misses)} of {len(FLEETS)} fleets"
        + (f"; misses: {', '.join(misses)}." if misses else "."),
        "",
        *(
            [
                f"Cells where no variant meets the SLO for {SLO_OUT_OF_REACH:.0%} of the "
                "requests (goodput cannot rank the variants there; compare their TTFT and "
                f"TPOT): {', '.join(unreachable)}.",
                "",
            ]
            if (unreachable := out_of_reach(cells))
            else []
        ),
        "## Invariant (LMetric variants, per seed, enginesim/replay/invariant.py)",
        "",
    ]
    if breaches:
        lines += [
            "| cell | variant | seeds breaking | every breach |",
            "|---|---|---:|---|",
        ]
        for row in breaches:
            lines.append(
                f"| {row['cell']} | {row['policy']} | {row['seeds_breaking']}/{row['seeds']} | "
                f"{'; '.join(row['breaches'])} |"
            )
    else:
        lines.append("Every variant keeps it in every cell.")
    lines += [
        "",
        "## Cells",
        "",
        f"`long_output`: {BURST.describe()}. `conversation`: a "
        f"{CONVERSATION_WINDOW_S:g} s window of the Mooncake conversation trace (seeded start, "
        "re-timed per seed). Rate scales per "
        "fleet (the reference fleet's low/high × the fleet's capacity factor):",
        "",
        "| fleet | conversation factor | long-output factor |",
        "|---|---:|---:|",
    ]
    for gpu, model in FLEETS:
        factor = capacity(gpu, model)
        lines.append(
            f"| {gpu}+{model} | {factor['conversation']:.2f} | {factor['long_output']:.2f} |"
        )
    lines.append("")
    for key, cell in cells.items():
        lines += [f"### {key}", "", *cell_table(cell), ""]
    (out / "README.md").write_text("\n".join(lines))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--fleet", action="append", help="GPU+MODEL, e.g. h20+qwen3-32b")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument(
        "--assemble", action="store_true", help="run nothing: rebuild README.md from results.json"
    )
    args = parser.parse_args(argv)
    if args.assemble:
        report(args.out, json.loads((args.out / "results.json").read_text()))
        return 0
    if args.seeds < 2:
        parser.error("--seeds must be at least 2: one seed has no interval")
    chosen = [
        regime
        for gpu, model in FLEETS
        if not args.fleet or f"{gpu}+{model}" in args.fleet
        for regime in fleet_regimes(gpu, model)
    ]
    if not chosen:
        parser.error(f"no fleet among {args.fleet}; known: {[f'{g}+{m}' for g, m in FLEETS]}")
    swept = variants()
    started = time.perf_counter()
    cells = run_suite(chosen, [*REFERENCES, *swept], args.seeds, args.jobs, swept)
    data: dict[str, Any] = {
        "seeds": args.seeds,
        "variants": list(swept),
        "cells": cells,
        "invariant": invariant_rows(cells, {name: "lmetric" for name in swept}),
        "wall_s": time.perf_counter() - started,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(data, indent=1) + "\n")
    report(args.out, data)
    print(f"wrote {args.out}/README.md in {data['wall_s'] / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
