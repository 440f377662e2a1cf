"""Several routers on one fleet, in replay: how much routing quality do they lose?

    .venv/bin/python -m bench.multi_router.replay            # the ~50% cells, 1500 requests each
    .venv/bin/python -m bench.multi_router.replay --quick    # 300 requests a cell, to bench/out

Each ~50%-busy Qwen2-7B cell of the evaluation matrix (bench/replay/run.py; its rate
scales are read from bench/replay/matrix.json) is replayed with 1, 2 and 4 routers
behind a round-robin load balancer. Every router has its own view and policy object; KV
events and /metrics scrapes reach all of them, and with replica sync (the live routers'
peer channel) each one also learns what the others dispatched. The telemetry delay (KV
events, scrapes, peer messages and the router's own first tokens all arrive that late) is
swept to show how the gap grows. Arrivals that share a timestamp (the conversation trace's
3 s buckets) are spread over their bucket first, for every router count alike (see
``spread_ties``). Writes bench/multi_router/README.md and results.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.lib import matrix
from enginesim.replay import metrics
from enginesim.replay.simulator import Simulator
from enginesim.replay.traces import select, spread_ties

HERE = Path(__file__).resolve().parent
LOAD = 50
POLICIES = ("lmetric", "predicted_ttft")
ROUTERS = (1, 2, 4)
DELAYS = (0.0, 1.0)  # telemetry: scrapes, KV events and the router's own first tokens
SYNC_DELAY = 0.005  # a Redis pub/sub hop between routers on one network
SLOW_SYNC_DELAY = 0.25  # a congested peer channel
NO_SYNC_DELAY = 1.0  # the telemetry delay also run without replica sync
GOAL = 0.10  # mean TTFT within 10% of one router's
REQUESTS = 1500  # per cell: the whole traces take hours on two cores (N routers × delays)


def variants() -> list[tuple[int, float, float | None]]:
    """(routers, telemetry delay, peer sync delay or None = no sync) for every run."""
    runs = [(n, d, SYNC_DELAY) for n in ROUTERS for d in DELAYS]
    return [
        *runs,
        (ROUTERS[-1], 0.0, SLOW_SYNC_DELAY),
        *[(n, NO_SYNC_DELAY, None) for n in ROUTERS[1:]],
    ]


def _run(job: tuple[str, float, str, int, float, float | None, int | None]) -> dict[str, Any]:
    workload, scale, policy, routers, delay, sync, limit = job
    records = spread_ties(
        select(matrix.WORKLOAD_BY_NAME[workload].build(limit), rate_scale=scale), seed=1
    )
    config = replace(
        matrix.config_for(matrix.MAIN_MODEL, policy),
        kv_events=True,
        routers=routers,
        telemetry_delay_s=delay,
        replica_sync=sync is not None,
        replica_sync_delay_s=sync or 0.0,
    )
    started = time.perf_counter()
    result = Simulator(records, policy, config).run()
    summary = metrics.summarize(result)
    return {
        "workload": workload,
        "policy": policy,
        "routers": routers,
        "delay_s": delay,
        "sync": sync,
        "requests": len(records),
        "wall_s": time.perf_counter() - started,
        **{k: summary[k] for k in ("ttft_mean_s", "ttft_p99_s", "hit_ratio")},
    }


def scales() -> dict[str, float]:
    return {w.name: matrix.committed_scale(w.name, LOAD) for w in matrix.WORKLOADS}


def _find(
    rows: list[dict[str, Any]],
    workload: str,
    policy: str,
    routers: int,
    delay: float,
    sync: float | None,
) -> dict[str, Any]:
    return next(
        r
        for r in rows
        if (r["workload"], r["policy"], r["routers"], r["delay_s"], r["sync"])
        == (workload, policy, routers, delay, sync)
    )


def _gap(row: dict[str, Any], one: dict[str, Any]) -> float:
    return row["ttft_mean_s"] / one["ttft_mean_s"] - 1


def _cell(row: dict[str, Any], one: dict[str, Any], judged: bool) -> str:
    gap = _gap(row, one)
    mark = " ✗" if judged and gap > GOAL else ""
    return f"{row['ttft_mean_s']:.2f} ({gap:+.0%}{mark})"


def gap_rows(rows: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """The table (N routers' mean TTFT against one router's at the same telemetry delay)
    and the judged cells that miss the goal."""
    many = ROUTERS[1:]
    head = [
        "workload",
        "policy",
        "1 router",
        *[f"×{n}" for n in many],
        f"1 router, {DELAYS[-1]:g} s",
        *[f"×{n}, {DELAYS[-1]:g} s" for n in many],
        f"×{ROUTERS[-1]}, peers {SLOW_SYNC_DELAY:g} s",
        *[f"×{n}, no sync, {NO_SYNC_DELAY:g} s" for n in many],
    ]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    misses = []
    for workload, policy in sorted({(r["workload"], r["policy"]) for r in rows}):

        def find(
            n: int, delay: float, sync: float | None, w: str = workload, p: str = policy
        ) -> dict[str, Any]:
            return _find(rows, w, p, n, delay, sync)

        fresh, stale = find(1, 0.0, SYNC_DELAY), find(1, DELAYS[-1], SYNC_DELAY)
        cells = [workload, f"`{policy}`", f"{fresh['ttft_mean_s']:.2f}"]
        for n in many:
            row = find(n, 0.0, SYNC_DELAY)
            cells.append(_cell(row, fresh, True))
            if _gap(row, fresh) > GOAL:
                misses.append(f"{workload} `{policy}` ×{n}")
        cells.append(f"{stale['ttft_mean_s']:.2f}")
        cells += [_cell(find(n, DELAYS[-1], SYNC_DELAY), stale, False) for n in many]
        cells.append(_cell(find(ROUTERS[-1], 0.0, SLOW_SYNC_DELAY), fresh, False))
        cells += [_cell(find(n, NO_SYNC_DELAY, None), stale, False) for n in many]
        lines.append("| " + " | ".join(cells) + " |")
    return lines, misses


def report(out: Path, data: dict[str, Any]) -> None:
    table, misses = gap_rows(data["rows"])
    text = [
        "# Several routers, one fleet (replay)",
        "",
        f"Generated by `python -m bench.multi_router.replay` on {data['machine']} in "
        f"{data['wall_s'] / 60:.1f} min"
        ".",
        "",
        f"The evaluation matrix's ~{LOAD}% cells on 16× H20 Qwen2-7B (rate scales from "
        f"`bench/replay/matrix.json`), the first {data['requests']} requests of each "
        "workload, arrivals spread within their timestamp bucket, "
        "KV events on, scrapes every 1 s. N routers behind a round-robin balancer, each "
        "with its own view and policy object. With replica sync each router applies the "
        f"others' dispatches, first tokens and finishes {SYNC_DELAY * 1000:g} ms later (one "
        "pub/sub hop); the telemetry delay holds back KV events, scrapes and the router's "
        "own first tokens and finishes. Mean TTFT in virtual seconds, gap against one "
        f"router at the same telemetry delay. Goal: ×2 and ×4 within {GOAL:.0%} of one "
        "router (✗ = miss), judged at zero telemetry delay; the other columns show how "
        "the gap grows with a stale view, a slow peer channel and no peer channel.",
        "",
        *table,
        "",
        "Misses: " + (", ".join(misses) or "none") + ".",
        "",
    ]
    (out / "README.md").write_text("\n".join(text))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--workload", action="append", choices=list(matrix.WORKLOAD_BY_NAME))
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--requests",
        type=int,
        default=REQUESTS,
        help="the first N requests of each cell's workload",
    )
    parser.add_argument(
        "--assemble", action="store_true", help="run nothing: rebuild README.md from results.json"
    )
    args = parser.parse_args(argv)
    out = args.out or (HERE.parent / "out" / "multi_router" if args.quick else HERE)
    if args.assemble:
        report(out, json.loads((out / "results.json").read_text()))
        return 0
    limit = 300 if args.quick else args.requests
    rate = scales()
    workloads = args.workload or [w.name for w in matrix.WORKLOADS]
    jobs = [
        (w, rate[w], p, n, d, s, limit)
        for w in workloads
        for p in POLICIES
        for n, d, s in variants()
    ]
    started = time.perf_counter()
    rows = []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for row in pool.map(_run, jobs):
            rows.append(row)
            print(
                f"{row['workload']:<13} {row['policy']:<15} ×{row['routers']} "
                f"delay {row['delay_s']:<5g} sync {row['sync']!s:<6} "
                f"TTFT {row['ttft_mean_s']:.3f}",
                flush=True,
            )
    out.mkdir(parents=True, exist_ok=True)
    data = {
        "quick": args.quick,
        "machine": matrix.machine(),
        "load": LOAD,
        "rows": rows,
        "requests": limit,
        "wall_s": time.perf_counter() - started,
    }
    (out / "results.json").write_text(json.dumps(data, indent=1) + "\n")
    report(out, data)
    print(f"wrote {out}/README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
