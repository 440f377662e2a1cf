"""Several routers on one live fleet: how much does replica sync recover?

For each policy (``lmetric``, ``predicted_ttft``) and each variant (1 router; 2 routers
with replica sync; 2 routers without), a fresh devharness.Fleet of enginesim instances
(16 x H20, Qwen2-7B, slow motion ``--time-scale S``) is started behind N standalone
``python -m router_worker`` processes (devharness.start_router), and enginesim's load generator
(``loadgen``) replays a slice of the Mooncake conversation trace through them, round-robin over
the routers (a load balancer: ``--target`` given N times). Routers use Redis (``--redis``)
for telemetry and the peer channel, each run under a cluster name of its own;
``router.peer_sync`` is false for the no-sync variant. Client TTFTs (wall seconds) are
divided by S: simulated seconds, comparable with the replay bench (bench/multi_router/replay.py).

    .venv/bin/python -m bench.multi_router.live [--time-scale 3] [--start 240 --end 300]

Process handling, fleet start and statistics come from bench.lib.live.
Results: printed, and written to bench/multi_router/live.md after every run (a partial
table if the bench is stopped).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.lib import live  # process handling, fleet, stats
from devharness import Fleet, Router, start_router, stop_together
from enginesim.replay.policy_costs import fill_coefficients

HERE = Path(__file__).resolve().parent
OUT = HERE / "live.md"
PY = live.PY
VARIANTS = ((1, True), (2, True), (2, False))  # (routers, peer sync)


def variant_name(routers: int, sync: bool) -> str:
    if routers == 1:
        return "1 router"
    return f"{routers} routers, {'sync' if sync else 'no sync'}"


def router_document(
    policy: str, sync: bool, cluster: str, fleet: Fleet, args: argparse.Namespace
) -> dict[str, Any]:
    params = fill_coefficients(policy, {}, "h20", "qwen2-7b")
    return {
        "cluster": cluster,
        "block_size": 16,
        "instances": fleet.instances(),
        "policy": {"kind": policy, "params": params, "seed": 0},
        "router": {
            "scrape_interval_s": args.scrape_interval * args.time_scale,
            "health_interval_s": 1.0,
            "health_timeout_s": 5.0,
            "first_byte_timeout_s": 3600.0,
            "queue_timeout_s": 600.0,
            "max_body_bytes": 64 * 1024 * 1024,
            "kv_events": False,
            "peer_sync": sync,
        },
    }


def start_routers(
    document: dict[str, Any], count: int, work: Path, tag: str, redis: str
) -> list[Router]:
    """``count`` standalone routers on ``document``, started together, each healthy."""
    routers = []
    try:
        for k in range(count):
            routers.append(
                start_router(
                    work,
                    document,
                    name=f"{tag}-r{k}",
                    admin_token=live.ADMIN_TOKEN,
                    redis_url=redis,
                    log_level="WARNING",
                    log=work / f"{tag}_router{k}.log",
                    new_session=True,
                    wait=False,
                )
            )
        for router in routers:
            router.wait_healthy(60)
    except BaseException:
        stop_together([router.managed for router in routers], 10.0)
        raise
    return routers


def peer_counts(targets: list[str]) -> dict[str, int]:
    """Replica-sync counters summed over the routers (from /admin/state)."""
    total: dict[str, int] = {}
    for target in targets:
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
            state = httpx.get(
                target + "/admin/state",
                timeout=5,
                headers={"Authorization": f"Bearer {live.ADMIN_TOKEN}"},
            ).json()
            for key, value in state["peers"]["counts"].items():
                total[key] = total.get(key, 0) + value
    return total


def run_loadgen(targets: list[str], args: argparse.Namespace, out: Path, log: Path) -> float:
    cmd = [
        PY,
        "-m",
        "enginesim",
        "loadgen",
        "--trace",
        str(args.trace),
        "--rate-scale",
        repr(args.rate_scale / args.time_scale),
        "--start",
        str(args.start),
        "--end",
        str(args.end),
        "--timeout",
        "3600",
        "--concurrency-limit",
        "1024",
        "--out",
        str(out),
        "--no-progress",
    ]
    if args.spread_ties:
        cmd += ["--spread-ties", "--seed", "1"]
    for target in targets:
        cmd += ["--target", target]
    started = time.monotonic()
    loadgen = live.spawn(cmd, log)
    try:
        loadgen.wait(args.run_timeout)
    except subprocess.TimeoutExpired:
        print(f"# loadgen still running after {args.run_timeout:.0f} s; stopping it", flush=True)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(loadgen.pid, signal.SIGINT)  # clean stop: writes --out
        loadgen.wait(60)
    live.stop(loadgen)
    return time.monotonic() - started


def run_variant(
    policy: str, routers: int, sync: bool, args: argparse.Namespace, work: Path
) -> dict[str, Any]:
    tag = f"{policy}_{routers}{'s' if sync else 'n'}"
    fleet = live.start_fleet(args, work / f"{tag}_fleet.log", variation=[])
    try:
        cluster = f"bench-multi-{os.getpid()}-{tag}"
        document = router_document(policy, sync, cluster, fleet, args)
        started = start_routers(document, routers, work, tag, args.redis)
        try:
            targets = [router.url for router in started]
            time.sleep(3 * args.scrape_interval * args.time_scale)  # a few scrapes first
            out = work / f"{tag}_loadgen.jsonl"
            wall = run_loadgen(targets, args, out, work / f"{tag}_loadgen.log")
            counts = peer_counts(targets)
            engine_sum, engine_count = live.engine_ttft(fleet)
        finally:
            stop_together([router.managed for router in started], 10.0)
    finally:
        fleet.stop()
    outcomes = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    ok = [o for o in outcomes if o["status"] == "ok"]
    scale = args.time_scale
    return {
        "policy": policy,
        "routers": routers,
        "sync": sync,
        "sent": len(outcomes),
        "ok": len(ok),
        "wall_s": wall,
        "per_target": {t: sum(o.get("target") == t for o in outcomes) for t in targets},
        "ttft": live.stats([o["ttft_s"] / scale for o in ok]) if ok else None,
        "hit": sum(o["cached_tokens"] or 0 for o in ok)
        / max(sum(o["prompt_tokens"] or 0 for o in ok), 1),
        "engine_ttft_mean": engine_sum / engine_count if engine_count else None,
        "peer_counts": counts,
    }


def report(args: argparse.Namespace, results: list[dict[str, Any]]) -> str:
    lines = [
        "# Several routers on one live fleet",
        "",
        f"Written by `python -m bench.multi_router.live`. Trace {args.trace.name} "
        f"[{args.start:g}, {args.end:g}) s, rate scale {args.rate_scale:g} (~50% busy), "
        f"{args.instances}x H20 Qwen2-7B enginesim, time scale {args.time_scale:g}, scrapes "
        f"every {args.scrape_interval:g} simulated s, KV events off; requests round-robin "
        "over the routers; replica sync over Redis pub/sub (router_worker/peers.py). TTFT in "
        "simulated seconds (client wall / time scale); engine-side: the engines' own TTFT "
        "histograms (what routing did, without router and client overheads). Arrivals "
        "sharing a timestamp "
        + (
            "are spread over their 3 s bucket (as in the replay bench)."
            if args.spread_ties
            else "are sent at one instant (tied arrivals)."
        ),
        "",
        "| policy | routers | ok/sent | mean TTFT | p50 | p99 | hit ratio | mean vs 1 router "
        "| p99 vs 1 router | engine-side mean | peer msgs applied | wall s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    single = {r["policy"]: r for r in results if r["routers"] == 1 and r["ttft"]}
    for r in results:
        ttft = r["ttft"]
        name = variant_name(r["routers"], r["sync"])
        if ttft is None:
            lines.append(f"| `{r['policy']}` | {name} | {r['ok']}/{r['sent']} | (no results) |")
            continue
        one = single.get(r["policy"])
        gap = p99_gap = "-"
        if one is not None and r is not one:
            gap = f"{ttft['mean'] / one['ttft']['mean'] - 1:+.1%}"
            p99_gap = f"{ttft['p99'] / one['ttft']['p99'] - 1:+.1%}"
        applied = sum(v for k, v in r["peer_counts"].items() if k.startswith("applied:"))
        engine = r["engine_ttft_mean"]
        lines.append(
            f"| `{r['policy']}` | {name} | {r['ok']}/{r['sent']} | {ttft['mean']:.3f} "
            f"| {ttft['p50']:.3f} | {ttft['p99']:.3f} | {r['hit']:.3f} | {gap} | {p99_gap} "
            f"| {'-' if engine is None else f'{engine:.3f}'} | {applied} | {r['wall_s']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--trace", type=Path, default=live.TRACE)
    add("--start", type=float, default=240.0)
    add("--end", type=float, default=300.0)
    add("--rate-scale", type=float, default=0.61, help="the matrix's ~50%% conversation cell")
    add("--time-scale", type=float, default=3.0, help="enginesim wall s per simulated s")
    add("--stream-interval", type=int, default=1)
    add("--scrape-interval", type=float, default=1.0, help="simulated seconds")
    add("--instances", type=int, default=16)
    add("--policies", nargs="+", default=["lmetric", "predicted_ttft"])
    add(
        "--tied-arrivals",
        dest="spread_ties",
        action="store_false",
        help="send each 3 s bucket of the trace at one instant (default: spread over the "
        "bucket, as bench/multi_router/replay.py does)",
    )
    add("--redis", default="redis://127.0.0.1:6379/10")
    add("--run-timeout", type=float, default=900.0, help="wall s per loadgen run at most")
    add("--work", type=Path, default=None, help="logs and raw results (default: a temp dir)")
    add("--out", type=Path, default=OUT)
    args = parser.parse_args()

    atexit.register(live.stop_all)
    signal.signal(signal.SIGINT, live.on_signal)
    signal.signal(signal.SIGTERM, live.on_signal)
    work = args.work or Path(tempfile.mkdtemp(prefix="multi_router_live_"))
    work.mkdir(parents=True, exist_ok=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    print(f"# work dir {work}", flush=True)
    began = time.monotonic()
    results: list[dict[str, Any]] = []
    try:
        for policy in args.policies:
            for routers, sync in VARIANTS:
                result = run_variant(policy, routers, sync, args, work)
                results.append(result)
                print(f"# {json.dumps(result)}", flush=True)
                args.out.write_text(report(args, results))
                (work / "summary.json").write_text(json.dumps(results, indent=1))
    finally:
        live.stop_all()
    print(report(args, results))
    print(f"# total wall {time.monotonic() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
