"""Robustness suite: every policy where the evaluation matrix's blind spots are.

The matrix runs one fleet (16 × H20, Qwen2-7B) of identical engines that behave exactly as
the policies' cost model says. This suite replays the regimes it leaves out, each at two
loads and several seeds, and checks the never-collapse invariant
(``enginesim.replay.invariant``) for Switchyard's own policies in every cell:

* ``long_output``: long outputs on a shared long prefix under KV and decode pressure (a
  generated burst over private background traffic);
* ``heterogeneous``: the Mooncake conversation trace on a fleet whose instances differ
  (one at half speed, three at 0.75, per-step jitter) and are mis-modelled (every
  instance's cost coefficients perturbed by up to ±20% from what the policies are told);
* ``mixed_gpus``: the same trace on half H20, half H100;
* ``telemetry_delay``: the trace with every engine report 1 s late;
* ``scrapes_only``: the trace with indicators from ``/metrics`` scrapes every 2 s and no
  KV events (the other regimes have KV events);
* ``routers``: the trace through three routers that do not share their dispatches;
* ``fleet_<gpu>_<model>``: the long-output burst and the trace on four other fleets.

The workloads are generated or windows of a public trace, written with their parameters
in the report; no policy is tuned to one of them. Loads are set by a rate scale per
regime (``low`` and ``high``, stated in the report). Seed k varies the simulator's seed
(tie-breaks, the fleet's jitter and perturbation; every fleet's engine steps carry seeded
jitter) and the workload: the generator's seed, or for the conversation trace a 600 s
window at a seeded start, re-timed within bins (``bench.lib.matrix``).

    python -m bench.robustness.run            # the suite → bench/robustness/
    python -m bench.robustness.run --quick    # our policies and the references, 2 seeds
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
    CONVERSATION_WINDOW_S,
    SLO,
    Regime,
    estimates,
    invariant_rows,
    parse_variant,
    regimes,
    run_suite,
)
from bench.lib.stats import Estimate, compare, rule_text
from enginesim.replay.invariant import OWN_POLICIES, REFERENCES, STATEMENT, VERSION
from router_worker.routing import REGISTRY

# ----------------------------------------------------------------- report


def _fmt(estimate: Estimate, spec: str) -> str:
    return "–" if estimate.n == 0 else estimate.format(spec)


def _goodputs(runs: list[dict[str, Any]]) -> list[float]:
    return [float(r["goodput_rps"] or 0.0) for r in sorted(runs, key=lambda run: run["seed"])]


def tied_with_best(cell: dict[str, list[dict[str, Any]]]) -> set[str]:
    """The policy with the best mean goodput and those the tie rule cannot tell from it
    (``bench/lib/stats.py``: paired over seeds, within 1% or an interval holding 0)."""
    best = max(cell, key=lambda p: estimates(cell[p], "goodput_rps").mean)
    reference = _goodputs(cell[best])
    return {
        policy
        for policy, runs in cell.items()
        if len(runs) == len(reference)
        and compare(_goodputs(runs), reference, higher_is_better=True).outcome == "tie"
    } | {best}


def cell_table(cell: dict[str, list[dict[str, Any]]]) -> list[str]:
    best = tied_with_best(cell)
    lines = [
        "| policy | goodput req/s | SLO met | mean TTFT s | p99 TTFT s | mean TPOT s | "
        "p99 TPOT s | output tok/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for policy, runs in cell.items():
        good = estimates(runs, "goodput_rps")
        name = f"**{policy}**" if policy in best else policy
        lines.append(
            f"| {name} | {_fmt(good, '.2f')} | {_fmt(estimates(runs, 'slo_attainment'), '.2f')} | "
            f"{_fmt(estimates(runs, 'ttft_mean_s'), '.3f')} | "
            f"{_fmt(estimates(runs, 'ttft_p99_s'), '.2f')} | "
            f"{_fmt(estimates(runs, 'tpot_mean_s'), '.4f')} | "
            f"{_fmt(estimates(runs, 'tpot_p99_s'), '.3f')} | "
            f"{_fmt(estimates(runs, 'throughput_tok_s'), '.0f')} |"
        )
    return lines


def _ratio(value: float | None, spec: str = ".2f") -> str:
    return "–" if value is None else f"{value:{spec}}"


def invariant_table(rows: list[dict[str, Any]], own: bool) -> list[str]:
    chosen = [row for row in rows if row["own"] == own and row["breaches"]]
    if not chosen:
        return ["None: every cell keeps it."]
    lines = [
        "| cell | policy | worst goodput ÷ better reference | worst TTFT ÷ best baseline | "
        "worst TPOT ÷ best baseline | seeds | every breach |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for row in chosen:
        lines.append(
            f"| {row['cell']} | {row['policy']} | {_ratio(row['goodput_ratio'], '.3f')} | "
            f"{_ratio(row['ttft_ratio'])} | {_ratio(row['tpot_ratio'])} | "
            f"{row['seeds_breaking']}/{row['seeds']} | {'; '.join(row['breaches'])} |"
        )
    return lines


def heatmap(cells: dict[str, Any], policies: Sequence[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    keys = list(cells)
    grid = np.full((len(keys), len(policies)), np.nan)
    for i, key in enumerate(keys):
        goodputs = {p: estimates(runs, "goodput_rps").mean for p, runs in cells[key].items()}
        best = max(goodputs.values()) or 1.0
        for j, policy in enumerate(policies):
            if policy in goodputs:
                grid[i, j] = goodputs[policy] / best
    fig, ax = plt.subplots(figsize=(1.1 * len(policies) + 3, 0.32 * len(keys) + 1.5))
    image = ax.imshow(grid, cmap="RdYlGn", vmin=0.5, vmax=1.0, aspect="auto")
    ax.set_xticks(range(len(policies)), policies, rotation=45, ha="right")
    ax.set_yticks(range(len(keys)), keys)
    for i in range(len(keys)):
        for j in range(len(policies)):
            if np.isfinite(grid[i, j]):
                ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=7)
    fig.colorbar(image, label="goodput ÷ the cell's best (seed means)")
    ax.set_title("Robustness suite: goodput relative to the best policy per cell")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(out: Path, data: dict[str, Any]) -> None:
    cells, rows = data["cells"], data["invariant"]
    lines = [
        "# Robustness suite",
        "",
        f"Generated by `python -m bench.robustness.run` in {data['wall_s'] / 60:.1f} min, "
        f"{data['seeds']} seeds per cell (mean ± 95% Student-t interval over seeds). "
        f"Goodput: requests per second of arrivals meeting TTFT ≤ {SLO.ttft_s:g} s and "
        f"TPOT ≤ {SLO.tpot_s:g} s together. In bold per cell: the best mean goodput and every "
        f"policy the tie rule cannot tell from it ({rule_text()}). The "
        f"invariant (enginesim/replay/invariant.py, v{VERSION}): {STATEMENT}.",
        "",
        "![goodput heatmap](heatmap.png)",
        "",
        "## Regimes",
        "",
        "| regime | workload | loads (rate scale) | cluster |",
        "|---|---|---|---|",
    ]
    for regime in data["regimes"]:
        lines.append(
            f"| `{regime['name']}` | {regime['workload']} | {regime['loads']} | "
            f"{regime['cluster']} |"
        )
    lines += [
        "",
        f"`long_output`: {BURST.describe()}. `conversation`: a "
        f"{CONVERSATION_WINDOW_S:g} s window of the Mooncake conversation trace at a seeded "
        "start, re-timed per seed.",
        "",
        "## Where Switchyard's own policies break the invariant",
        "",
        *invariant_table(rows, own=True),
        "",
        "## Where baselines break it (reported, not bent to pass)",
        "",
        *invariant_table(rows, own=False),
        "",
        "## Cells",
        "",
    ]
    for key, cell in cells.items():
        lines += [f"### {key}", "", *cell_table(cell), ""]
    (out / "README.md").write_text("\n".join(lines))


# What the control plane shows an operator choosing a policy (the policy form and API).
CONTROL_PLANE_SUMMARY = (
    Path(__file__).resolve().parents[2] / "controlplane" / "data" / ("robustness.json")
)


def control_plane_summary(data: dict[str, Any], policies: Sequence[str]) -> dict[str, Any]:
    """Per policy kind: the cells run and those where it breaks the invariant."""
    cells = list(data["cells"])
    summary: dict[str, Any] = {
        "source": "bench/robustness/run.py (report: bench/robustness/README.md)",
        "generated": time.strftime("%Y-%m-%d", time.gmtime()),
        "seeds": data["seeds"],
        "invariant": f"v{VERSION}, {STATEMENT}",
        "policies": {},
    }
    for policy in policies:
        if policy in REFERENCES:
            continue
        breaks = [
            {"cell": row["cell"], "breaches": row["breaches"]}
            for row in data["invariant"]
            if row["policy"] == policy and row["breaches"]
        ]
        summary["policies"][policy] = {"cells": len(cells), "breaks": breaks}
    return summary


def regime_rows(chosen: Sequence[Regime]) -> list[dict[str, str]]:
    rows = []
    for regime in chosen:
        sim = {"instances": 16, "gpu": "h20", "model": "qwen2-7b", **regime.sim}
        cluster = f"{sim.pop('instances')} × {sim.pop('gpu')} + {sim.pop('model')}"
        extras = [f"{k} {v}" for k, v in {**sim, **regime.variation}.items()]
        rows.append(
            {
                "name": regime.name,
                "workload": regime.workload,
                "loads": ", ".join(f"{k} {v:g}" for k, v in regime.loads.items()),
                "cluster": "; ".join([cluster, *extras]),
            }
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="own policies + references, 2 seeds")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--regime", action="append", help="run only these regimes")
    parser.add_argument("--policy", action="append", choices=list(REGISTRY))
    parser.add_argument(
        "--variant",
        action="append",
        type=parse_variant,
        default=[],
        help='a policy with other parameters, NAME=KIND:JSON (e.g. c0=lmetric:{"batch_offset":0})',
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--assemble", action="store_true", help="run nothing: rebuild README.md from results.json"
    )
    args = parser.parse_args(argv)
    here = Path(__file__).resolve().parent
    out = args.out or (here.parent / "out" / "robustness" if args.quick else here)
    if args.assemble:
        report(out, json.loads((out / "results.json").read_text()))
        return 0
    chosen = [r for r in regimes() if not args.regime or r.name in args.regime]
    if not chosen:
        parser.error(f"no regime named {args.regime}; known: {[r.name for r in regimes()]}")
    policies = args.policy or ([*REFERENCES, *OWN_POLICIES] if args.quick else list(REGISTRY))
    variants = {name: (kind, params) for name, kind, params in args.variant}
    policies = [*policies, *variants]
    seeds = 2 if args.quick else args.seeds
    if seeds < 2:
        parser.error("--seeds must be at least 2: one seed has no interval")
    started = time.perf_counter()
    cells = run_suite(chosen, policies, seeds, args.jobs, variants)
    data: dict[str, Any] = {
        "seeds": seeds,
        "regimes": regime_rows(chosen),
        "cells": cells,
        "invariant": invariant_rows(cells, {name: kind for name, (kind, _) in variants.items()}),
        "wall_s": time.perf_counter() - started,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(data, indent=1) + "\n")
    heatmap(cells, policies, out / "heatmap.png")
    report(out, data)
    if not (args.quick or args.regime or args.policy or args.variant):  # a whole run only
        CONTROL_PLANE_SUMMARY.parent.mkdir(exist_ok=True)
        summary = control_plane_summary(data, policies)
        CONTROL_PLANE_SUMMARY.write_text(json.dumps(summary, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {out}/README.md in {data['wall_s'] / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
