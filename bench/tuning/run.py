"""Re-deciding a ``matrix`` default: chosen on the tuning split, reported on the evaluation.

    .venv/bin/python -m bench.tuning.run [--quick] [--jobs 2] [--seeds 3] [--param NAME]

For each tunable default (``TUNABLES``: a policy parameter whose provenance is ``matrix``
and the values it may take), every candidate replays every cell of the tuning split
(``bench/lib/splits.py``: trace halves, generator seeds and fleets the evaluation never
sees), each cell at the rate scale that keeps the calibration policy ``LOAD`` % busy, under
``--seeds`` seeds that resample the workload and the engines. The tie rule
(``bench/lib/stats.py``: paired over seeds, a difference within 1% or whose interval
holds 0 is a tie) judges each candidate against the current default cell by cell, on
goodput. **A default moves only on a win across the split**: better in a strict
majority of the tuning cells and worse in none; among several such candidates, the one
with the highest mean goodput ratio to the default. Never on a few cells.

Then the current default and the chosen value (or, when nothing won, the candidate with
the best mean ratio: what moving would have done) replay the evaluation split, and the
report gives each cell's verdict there. Writes ``results.json`` and ``README.md`` under
``--out`` (default ``bench/tuning/``; ``--quick``: ``bench/out/tuning/``, 600 requests a
cell).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.lib import splits, stats
from bench.lib.matrix import WORKLOAD_BY_NAME, calibrate, machine, scale_for, simulate
from enginesim.replay import metrics
from enginesim.replay.traces import select
from router_worker.routing import REGISTRY
from router_worker.routing.provenance import params_provenance

# name (kind.path.to.field) → the values tried; the current default must be among them.
# Every default of provenance ``matrix`` is here (tests/replay/test_splits.py checks it): a
# halving and a doubling around a number, both sides of a switch. The tier costs only act
# on a fleet with a global KV tier, which no cell of either split has: their runs tie.
TUNABLES: dict[str, tuple[Any, ...]] = {
    "lmetric.batch_offset": (0.0, 1.0, 4.0, 16.0, 48.0),
    "lmetric.hotspot.min_class_requests": (4, 8, 16),
    "lmetric.hotspot.max_hit_fraction": (0.25, 0.5, 0.75),
    "lmetric.tier_token_cost": (0.05, 0.1, 0.2),
    "smetric.slo_ttft_s": (0.15, 0.3, 0.6),
    "smetric.slo_ttft_per_1k_prompt_s": (0.075, 0.15, 0.3),
    "smetric.migrate_margin": (0.0, 0.1, 0.25),
    "smetric.migrate_max_queue_s": (1.0, 2.0, 4.0),
    "smetric.followup_hit_ratio": (0.25, 0.5, 0.75),
    "smetric.followup_min_hit_tokens": (128, 256, 512),
    "smetric.tier_token_cost": (0.05, 0.1, 0.2),
    "smetric.tier_rebalance": (False, True),
    "smetric.hotspot.min_class_requests": (4, 8, 16),
    "smetric.hotspot.max_hit_fraction": (0.25, 0.5, 0.75),
    "predicted_ttft.kv_pressure": (False, True),
    "predicted_ttft.tier_token_cost": (0.05, 0.1, 0.2),
    "predicted_ttft.hotspot.min_class_requests": (4, 8, 16),
    "predicted_ttft.hotspot.max_hit_fraction": (0.25, 0.5, 0.75),
    "dualmap.slo_ttft_s": (0.5, 1.0, 2.0),  # a baseline's: it gets its best value too
}
WORKLOADS = ("azure_code", "conversation", "agentic")
LOAD = 70  # percent busy of the calibration policy
QUICK_REQUESTS = 600
KEEP = ("goodput_rps", "ttft_mean_s", "tpot_mean_s")


@dataclass(frozen=True)
class Cell:
    workload: str
    gpu: str
    model: str

    @property
    def key(self) -> str:
        return f"{self.workload}@{self.gpu}+{self.model}"


def cells(split: splits.Split) -> list[Cell]:
    return [Cell(w, gpu, model) for w in WORKLOADS for gpu, model in splits.FLEETS[split]]


def tunable(name: str) -> tuple[str, list[str], Any]:
    """(kind, field path, current default) of ``kind.path.to.field``; refuses a parameter
    whose provenance is not ``matrix``."""
    kind, *path = name.split(".")
    node: Any = REGISTRY[kind].Params()
    for part in path:
        node = getattr(node, part)
    provenance = params_provenance(REGISTRY[kind].Params).get(".".join(path))
    if provenance is None or provenance.provenance != "matrix":
        raise ValueError(f"{name}: not a default with provenance 'matrix'")
    return kind, path, node


def nested(path: Sequence[str], value: Any) -> dict[str, Any]:
    """``["hotspot", "window_s"], 30`` → ``{"hotspot": {"window_s": 30}}``."""
    out: Any = value
    for part in reversed(path):
        out = {part: out}
    return dict(out)


# ----------------------------------------------------------------- running

Job = tuple[str, Cell, str, dict[str, Any], int, float, int | None]


def _calibrate(args: tuple[str, Cell, int | None]) -> tuple[str, str, float]:
    split, cell, limit = args
    requests = splits.records(cell.workload, split, 0, limit)  # type: ignore[arg-type]
    fit = calibrate(requests, cell.model, cell.workload, cell.gpu)
    return split, cell.key, scale_for(fit, LOAD)


def _run(job: Job) -> tuple[str, str, str, int, dict[str, Any]]:
    split, cell, kind, params, replicate, scale, limit = job
    spec = WORKLOAD_BY_NAME[cell.workload]
    requests = select(
        splits.records(cell.workload, split, replicate, limit),  # type: ignore[arg-type]
        rate_scale=scale,
    )
    result = simulate(requests, kind, cell.model, cell.workload, replicate, cell.gpu, params)
    summary = metrics.summarize(result, spec.slo)
    label = json.dumps(params, sort_keys=True)
    return split, cell.key, label, replicate, {k: summary.get(k) for k in KEEP}


def replay(
    pool: ProcessPoolExecutor,
    split: splits.Split,
    kind: str,
    settings: Sequence[dict[str, Any]],
    scales: Mapping[str, float],
    seeds: int,
    limit: int | None,
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """cell key → setting label → per-seed summaries (seed order)."""
    jobs: list[Job] = [
        (split, cell, kind, params, r, scales[cell.key], limit)
        for cell in cells(split)
        for params in settings
        for r in range(seeds)
    ]
    out: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for _, key, label, replicate, summary in sorted(
        pool.map(_run, jobs), key=lambda item: (item[1], item[2], item[3])
    ):
        out.setdefault(key, {}).setdefault(label, []).append(summary | {"seed": replicate})
    return out


# ----------------------------------------------------------------- the tie rule


def _goodput(runs: Sequence[Mapping[str, Any]]) -> np.ndarray:
    return np.array([float(r["goodput_rps"] or 0.0) for r in runs])


def judge(
    results: Mapping[str, Mapping[str, Sequence[Mapping[str, Any]]]], default: str, other: str
) -> dict[str, Any]:
    """``other`` against ``default`` per cell (the tie rule on goodput) and overall."""
    per_cell = {}
    ratios = []
    for key, by_setting in results.items():
        a, b = _goodput(by_setting[other]), _goodput(by_setting[default])
        comparison = stats.compare(a, b, higher_is_better=True)
        per_cell[key] = comparison.outcome
        ratios.append(float(a.mean()) / float(b.mean()) if b.mean() > 0 else 1.0)
    outcomes = list(per_cell.values())
    return {
        "cells": per_cell,
        "better": outcomes.count("better"),
        "worse": outcomes.count("worse"),
        "tie": outcomes.count("tie"),
        "mean_ratio": float(np.mean(ratios)) if ratios else 1.0,
        "wins_split": outcomes.count("better") * 2 > len(outcomes) and outcomes.count("worse") == 0,
    }


def choose(
    results: Mapping[str, Mapping[str, Sequence[Mapping[str, Any]]]],
    default: str,
    candidates: Sequence[str],
) -> tuple[str, dict[str, dict[str, Any]]]:
    """The value the tie rule keeps (the default unless a candidate wins across the split)
    and every candidate's judgement against the default."""
    judged = {c: judge(results, default, c) for c in candidates if c != default}
    winners = [c for c, j in judged.items() if j["wins_split"]]
    if not winners:
        return default, judged
    return max(winners, key=lambda c: judged[c]["mean_ratio"]), judged


# ----------------------------------------------------------------- report


def report(out: Path, data: Mapping[str, Any]) -> None:
    lines = [
        "# Tuning split → evaluation split",
        "",
        f"Generated by `python -m bench.tuning.run{' --quick' if data['quick'] else ''}` "
        f"in {data['wall_s'] / 60:.1f} min on {data['machine']}; {data['seeds']} seeds a "
        f"cell, each cell at the rate scale that keeps `cache_aware` {LOAD}% busy, "
        f"{data['requests'] or 'all'} requests a cell. The split: `bench/lib/splits.py`. The "
        "rule: a default moves only when a candidate is better on goodput (tie rule: "
        f"{stats.rule_text()}) in a strict majority of the tuning cells and worse in none.",
        "",
    ]
    if data.get("parts"):  # several runs, each of some parameters (--assemble)
        lines += ["Assembled from these runs' results:", ""]
        lines += [f"* {part}" for part in data["parts"]] + [""]
    for name, entry in data["tunables"].items():
        lines += [f"## `{name}`", "", *_tunable_lines(entry), ""]
    (out / "README.md").write_text("\n".join(lines))


def _tunable_lines(entry: Mapping[str, Any]) -> list[str]:
    default, chosen = entry["default"], entry["chosen"]
    moved = "moves to" if chosen != default else "stays at"
    lines = [
        f"Current default {default}; the tuning split {moved} {chosen}.",
        "",
        "| candidate | tuning cells better | tie | worse | mean goodput ÷ default's | "
        "wins the split |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for value, j in entry["judged"].items():
        lines.append(
            f"| {value} | {j['better']} | {j['tie']} | {j['worse']} | {j['mean_ratio']:.3f} | "
            f"{'yes' if j['wins_split'] else 'no'} |"
        )
    ev = entry["evaluation"]
    lines += [
        "",
        f"On the evaluation split, {ev['value']} against the default {default} "
        f"(per cell, tie rule on goodput; mean ratio {ev['judged']['mean_ratio']:.3f}):",
        "",
        "| evaluation cell | verdict |",
        "|---|---|",
        *(f"| {key} | {outcome} |" for key, outcome in ev["judged"]["cells"].items()),
    ]
    return lines


# ----------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_REQUESTS} requests a cell")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--param", action="append", choices=list(TUNABLES))
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--assemble",
        type=Path,
        nargs="+",
        metavar="RESULTS",
        help="run nothing: merge these results.json files (each run's own parameters; the "
        "same seeds and size) into --out's results.json and README.md",
    )
    args = parser.parse_args(argv)
    if args.assemble:
        return assemble(args.assemble, args.out or Path(__file__).resolve().parent)
    if args.seeds < 2:
        parser.error("--seeds must be at least 2: one seed has no interval")
    here = Path(__file__).resolve().parent
    out = args.out or (here.parent / "out" / "tuning" if args.quick else here)
    limit = QUICK_REQUESTS if args.quick else None
    started = time.perf_counter()
    data: dict[str, Any] = {"quick": args.quick, "seeds": args.seeds, "requests": limit}
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        calibration = [(s, c, limit) for s in splits.SPLITS for c in cells(s)]
        scales: dict[str, dict[str, float]] = {s: {} for s in splits.SPLITS}
        for split, key, scale in pool.map(_calibrate, calibration):
            scales[split][key] = scale
        data["scales"] = scales
        data["tunables"] = {}
        data["machine"] = machine()
        out.mkdir(parents=True, exist_ok=True)
        for name in args.param or TUNABLES:  # written after each: a long run keeps its part
            data["tunables"][name] = tune(pool, name, scales, args.seeds, limit)
            data["wall_s"] = time.perf_counter() - started
            (out / "results.json").write_text(json.dumps(data, indent=1) + "\n")
            report(out, data)
            print(f"{name}: wrote {out}/README.md at {data['wall_s'] / 60:.1f} min", flush=True)
    return 0


def assemble(paths: Sequence[Path], out: Path) -> int:
    """One report from several runs of the same size, each over its own parameters."""
    runs = [json.loads(path.read_text()) for path in paths]
    sizes = {(run["quick"], run["seeds"], run["requests"]) for run in runs}
    if len(sizes) != 1:
        raise SystemExit(f"the runs differ in size (quick, seeds, requests): {sorted(sizes)}")
    data = {**runs[0], "tunables": {}, "parts": []}
    data["wall_s"] = sum(run["wall_s"] for run in runs)
    for run in runs:
        data["tunables"] |= run["tunables"]
        names = ", ".join(f"`{name}`" for name in run["tunables"])
        data["parts"].append(f"{run['wall_s'] / 60:.1f} min on {run['machine']}: {names}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(data, indent=1) + "\n")
    report(out, data)
    print(f"wrote {out}/README.md from {len(runs)} runs")
    return 0


def tune(
    pool: ProcessPoolExecutor,
    name: str,
    scales: Mapping[str, Mapping[str, float]],
    seeds: int,
    limit: int | None,
) -> dict[str, Any]:
    kind, path, default = tunable(name)
    values = TUNABLES[name]
    if default not in values:
        raise ValueError(f"{name}: the current default {default} is not among {values}")
    labels = {json.dumps(nested(path, v), sort_keys=True): v for v in values}
    settings = [nested(path, v) for v in values]
    tuning = replay(pool, "tuning", kind, settings, scales["tuning"], seeds, limit)
    default_label = json.dumps(nested(path, default), sort_keys=True)
    chosen_label, judged = choose(tuning, default_label, list(labels))
    shown = chosen_label
    if chosen_label == default_label:  # nothing won: show what the best mean would do
        shown = max(judged, key=lambda c: judged[c]["mean_ratio"])
    pair = [nested(path, default), json.loads(shown)]
    evaluation = replay(pool, "evaluation", kind, pair, scales["evaluation"], seeds, limit)
    return {
        "default": default,
        "chosen": labels[chosen_label],
        "judged": {str(labels[c]): j for c, j in judged.items()},
        "tuning_runs": tuning,
        "evaluation": {
            "value": labels[shown],
            "judged": judge(evaluation, default_label, shown),
            "runs": evaluation,
        },
    }


if __name__ == "__main__":
    sys.exit(main())
