"""DualMap's TTFT SLO (``slo_ttft_s``): a small sweep that picks its default.

    .venv/bin/python -m bench.dualmap_slo.run [--jobs 2]      # → bench/dualmap_slo/
    .venv/bin/python -m bench.dualmap_slo.run --slo 1 --slo 2 --cell agentic/70  # → bench/out/
    .venv/bin/python -m bench.dualmap_slo.run --assemble      # README.md from results.json

The SLO decides when DualMap gives up cache affinity (the affinity candidate's estimated
TTFT above it → the other candidate) and when it migrates queued requests off an instance
(docs/algorithms.md, "dualmap"). Each cell (a workload/load of the evaluation matrix, rate
scale from the committed calibration fit in ``bench/replay/matrix.json``) is replayed at
every SLO with migration on, plus once at DualMap's default SLO with migration off. Per
run: mean, p99 TTFT, the share of decisions that leave the affinity candidate
(``hotspot_rebalance``), migrations; and per SLO the geometric mean over cells of mean
TTFT ÷ the cell's best mean TTFT, which is what the default is chosen by (the value that
is good across cells, not in one). The whole run sweeps three cells at six SLOs, then
checks two more cells at three of them, and writes ``README.md`` (tables and reading, all
from this run) and ``results.json``; ``--cell``/``--slo`` run one custom sweep into
``bench/out/dualmap_slo/``.
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
from pathlib import Path
from typing import Any

from bench.lib.matrix import BASE, WORKLOAD_BY_NAME, committed_scale, machine
from enginesim.replay import metrics
from enginesim.replay.simulator import Simulator
from enginesim.replay.traces import select
from router_worker.routing.policies.dualmap import DualMapParams

CELLS = ("conversation/70", "synthetic/70", "burst/70")
SLOS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
CHECK_CELLS = ("conversation/50", "agentic/70")  # agentic: short prompts, hot system prompts
CHECK_SLOS = (1.0, 2.0, 8.0)
DEFAULT = DualMapParams().slo_ttft_s  # the policy's default, also run with migration off
HERE = Path(__file__).resolve().parent


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


def geo_means(rows: list[dict[str, Any]]) -> dict[float, tuple[float, float]]:
    """Per SLO (migration on): geometric mean and worst over cells of mean TTFT ÷ the cell's
    best."""
    on = [r for r in rows if r["migrate"]]
    best = {c: min(r["ttft_mean_s"] for r in on if r["cell"] == c) for c in {r["cell"] for r in on}}
    out = {}
    for slo in sorted({r["slo"] for r in on}):
        ratios = [r["ttft_mean_s"] / best[r["cell"]] for r in on if r["slo"] == slo]
        out[slo] = (math.exp(sum(map(math.log, ratios)) / len(ratios)), max(ratios))
    return out


def ranking(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| SLO s | geo-mean of mean TTFT ÷ cell best | worst cell ratio |", "|---:|---:|---:|"]
    for slo, (geo, worst) in geo_means(rows).items():
        lines.append(f"| {slo:g} | {geo:.3f} | {worst:.3f} |")
    return lines


def reading(sections: list[dict[str, Any]], default: float) -> list[str]:
    """What the tables say, every number from them: the SLO each sweep and all cells pick."""
    sweep = sections[0]["rows"]
    geo = geo_means(sweep)
    chosen = min(geo, key=lambda slo: geo[slo][0])
    near = [slo for slo, (mean, _) in geo.items() if mean <= 1.02]
    lines = [
        f"Over the first sweep's cells ({', '.join(sorted({r['cell'] for r in sweep}))}) "
        f"{chosen:g} s has the lowest geometric mean ({geo[chosen][0]:.3f}; worst cell "
        f"{geo[chosen][1]:.3f})"
        + (
            f"; within 2% of the cells' best on the geometric mean: "
            f"{', '.join(f'{slo:g} s' for slo in near)}"
            if near
            else ""
        )
        + (
            f"; the largest, {max(geo):g} s, loses {geo[max(geo)][0] - 1:+.0%}."
            if len(geo) > 1
            else "."
        ),
    ]
    every = [r for section in sections for r in section["rows"]]
    common = sorted(
        set.intersection(*({r["slo"] for r in s["rows"] if r["migrate"]} for s in sections))
    )
    if len(sections) > 1 and len(common) > 1:
        on = [r for r in every if r["migrate"] and r["slo"] in common]
        cells = sorted({r["cell"] for r in on})
        wins = {slo: 0 for slo in common}
        for cell in cells:
            mine = [r for r in on if r["cell"] == cell]
            wins[min(mine, key=lambda r: r["ttft_mean_s"])["slo"]] += 1
        overall = geo_means(on)
        pick = min(overall, key=lambda slo: overall[slo][0])
        lines += [
            "",
            f"Over all {len(cells)} cells at {', '.join(f'{slo:g}' for slo in common)} s: "
            + "the lowest mean TTFT on "
            + ", ".join(f"{n} of them at {slo:g} s" for slo, n in wins.items())
            + f"; {pick:g} s has the lowest geometric mean ({overall[pick][0]:.3f}).",
        ]
        chosen = pick
    moves = [r for r in every if r["migrate"] and r["slo"] == default]
    off = {r["cell"]: r for r in every if not r["migrate"]}
    if moves and off:
        lines += [
            "",
            f"Migration at {default:g} s: "
            + "; ".join(
                f"{r['cell']} {r['migrations']} moves, mean TTFT "
                f"{r['ttft_mean_s'] / off[r['cell']]['ttft_mean_s'] - 1:+.1%}"
                for r in moves
                if r["cell"] in off
            )
            + " (against migration off).",
        ]
    verdict = "matches" if chosen == default else "DIFFERS from"
    lines += [
        "",
        f"**This run picks {chosen:g} s, which {verdict} DualMap's default ({default:g} s).**",
    ]
    return lines


def document(data: dict[str, Any]) -> str:
    """README.md from results.json alone."""
    command = f"python -m bench.dualmap_slo.run {data['command']}".rstrip()
    lines = [
        "# DualMap: choosing `slo_ttft_s`",
        "",
        f"Generated by `{command}` on {data['machine']} in {data['wall_s'] / 60:.1f} min. Cluster: "
        f"{BASE.instances} × {BASE.gpu.upper()}, {BASE.model}, seed {BASE.seed}, the replay "
        "matrix's rate scales (`bench/replay/matrix.json` calibration); one seed per run. "
        '"leave affinity" = share of routing decisions that went to the non-affinity '
        'candidate (`hotspot_rebalance`); "migrations" = queued requests moved '
        '(docs/algorithms.md, "dualmap"). Migration is on except in the rows at DualMap\'s '
        f"default ({data['default_slo']:g} s) marked off.",
        "",
    ]
    for section in data["sections"]:
        lines += [
            f"## {section['title']}",
            "",
            *table(section["rows"]),
            "",
            "Per SLO (migration on), mean TTFT ÷ the cell's best mean TTFT:",
            "",
            *ranking(section["rows"]),
            "",
        ]
    lines += ["## Reading", "", *reading(data["sections"], data["default_slo"]), ""]
    return "\n".join(lines)


def sweep(pool: ProcessPoolExecutor, cells: Sequence[str], slos: Sequence[float]) -> list[Any]:
    jobs = [(c, s, True) for s in slos for c in cells] + [(c, DEFAULT, False) for c in cells]
    rows = []
    for row in pool.map(_run, jobs):
        rows.append(row)
        print(json.dumps(row), flush=True)  # progress; the tables follow at the end
    rows.sort(key=lambda r: (r["cell"], r["slo"], r["migrate"]))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--slo", action="append", type=float, help="seconds (repeatable)")
    parser.add_argument("--cell", action="append", help="workload/load, e.g. conversation/70")
    parser.add_argument("--out", type=Path, help="default: bench/dualmap_slo, or bench/out/...")
    parser.add_argument(
        "--assemble", action="store_true", help="run nothing: rebuild README.md from results.json"
    )
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
    custom = bool(args.cell or args.slo)
    out = args.out or (HERE.parent / "out" / "dualmap_slo" if custom else HERE)
    if args.assemble:
        (out / "README.md").write_text(document(json.loads((out / "results.json").read_text())))
        return 0
    plan = (
        [("Custom sweep", args.cell or CELLS, args.slo or SLOS)]
        if custom
        else [("Sweep", CELLS, SLOS), ("Check on more cells", CHECK_CELLS, CHECK_SLOS)]
    )
    started = time.perf_counter()
    sections = []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for title, cells, slos in plan:
            sections.append({"title": title, "rows": sweep(pool, cells, slos)})
    data = {
        "command": " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine(),
        "wall_s": time.perf_counter() - started,
        "default_slo": DEFAULT,
        "sections": sections,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(data, indent=1) + "\n")
    text = document(data)
    (out / "README.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
