"""DualMap's TTFT SLO (``slo_ttft_s``): a small sweep that picks its default.

    .venv/bin/python -m bench.dualmap_slo.run [--jobs 2] [--slo 0.5 --slo 1 ...]
        [--cell conversation/70 --cell synthetic/70 ...]

The SLO decides when DualMap gives up cache affinity (the affinity candidate's estimated
TTFT above it → the other candidate) and when it migrates queued requests off an instance
(docs/algorithms.md, "dualmap"). Each cell (workload/load of the evaluation matrix, rate
scale from the committed calibration fit in ``bench/replay/matrix.json``) is
replayed at every SLO with migration on, plus once at the old default (1 s) with migration
off. Printed per run: mean, p99 TTFT, the share of decisions that leave the affinity
candidate (``hotspot_rebalance``), migrations; and per SLO the geometric mean over cells
of mean TTFT ÷ the cell's best mean TTFT, which is what the default is chosen by (the
value that is good across cells, not in one). Results: ``bench/dualmap_slo/README.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from typing import Any

from bench.lib.matrix import BASE, WORKLOAD_BY_NAME, committed_scale
from enginesim.replay import metrics
from enginesim.replay.simulator import Simulator
from enginesim.replay.traces import select

CELLS = ("conversation/70", "synthetic/70", "burst/70")
SLOS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
OLD_DEFAULT = 1.0


def _run(job: tuple[str, float, bool]) -> dict[str, Any]:
    cell, slo, migrate = job
    workload, load = cell.split("/")
    scale = committed_scale(workload, int(load))
    records = select(WORKLOAD_BY_NAME[workload].build(None), rate_scale=scale)
    params = {"dualmap": {"slo_ttft_s": slo, "migrate_queued": migrate}}
    started = time.perf_counter()
    result = Simulator(records, "dualmap", replace(BASE, policy_params=params)).run()
    summary = metrics.summarize(result)
    reasons = dict(result.decision_reasons)
    decisions = sum(v for k, v in reasons.items() if k != "migration")
    return {
        "cell": cell,
        "slo": slo,
        "migrate": migrate,
        "ttft_mean_s": summary["ttft_mean_s"],
        "ttft_p99_s": summary["ttft_p99_s"],
        "leave_share": reasons.get("hotspot_rebalance", 0) / max(decisions, 1),
        "migrations": result.migrations,
        "completed": sum(r.status == "ok" for r in result.requests),
        "requests": len(records),
        "wall_s": time.perf_counter() - started,
    }


def table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| cell | SLO s | migration | mean TTFT s | p99 TTFT s | leave affinity | "
        "migrations | completed |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['cell']} | {r['slo']:g} | {'on' if r['migrate'] else 'off'} | "
            f"{r['ttft_mean_s']:.3f} | {r['ttft_p99_s']:.2f} | "
            f"{r['leave_share']:.1%} | {r['migrations']} | "
            f"{r['completed']}/{r['requests']} |"
        )
    return lines


def ranking(rows: list[dict[str, Any]]) -> list[str]:
    """Per SLO (migration on): geometric mean over cells of mean TTFT ÷ the cell's best."""
    on = [r for r in rows if r["migrate"]]
    best = {c: min(r["ttft_mean_s"] for r in on if r["cell"] == c) for c in {r["cell"] for r in on}}
    lines = ["| SLO s | geo-mean of mean TTFT ÷ cell best | worst cell ratio |", "|---:|---:|---:|"]
    for slo in sorted({r["slo"] for r in on}):
        ratios = [r["ttft_mean_s"] / best[r["cell"]] for r in on if r["slo"] == slo]
        geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
        lines.append(f"| {slo:g} | {geo:.3f} | {max(ratios):.3f} |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--slo", action="append", type=float, help="seconds (repeatable)")
    parser.add_argument("--cell", action="append", help="workload/load, e.g. conversation/70")
    args = parser.parse_args(argv)
    for cell in args.cell or ():
        workload, _, load = cell.partition("/")
        if workload not in WORKLOAD_BY_NAME or not load.isdigit():
            parser.error(
                f"--cell {cell!r}: expected WORKLOAD/LOAD with WORKLOAD one of "
                f"{', '.join(WORKLOAD_BY_NAME)}"
            )
    if any(s <= 0 for s in args.slo or ()):
        parser.error("--slo must be > 0")
    cells, slos = args.cell or CELLS, args.slo or SLOS
    jobs = [(c, s, True) for s in slos for c in cells] + [(c, OLD_DEFAULT, False) for c in cells]
    rows = []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for row in pool.map(_run, jobs):
            rows.append(row)
            print(json.dumps(row), flush=True)  # progress; the tables follow at the end
    rows.sort(key=lambda r: (r["cell"], r["slo"], r["migrate"]))
    print("\n".join(table(rows)))
    print()
    print("\n".join(ranking(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
