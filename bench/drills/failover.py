"""Failover drills: a killed instance's streams continued elsewhere (live), an instance
slowed mid-run found and drained (replay), and false alarms on a fleet heterogeneous by
design (replay). Prints one table per drill.

    .venv/bin/python -m bench.drills.failover                  # all three
    .venv/bin/python -m bench.drills.failover --only slowed    # kill | slowed | false_alarms
    .venv/bin/python -m bench.drills.failover --quick          # smaller, for a smoke run

The replay drills run the live router's own detector (``router_worker.routing.grey``) in
the simulator on a steady synthetic load: ``rate`` requests a second per instance, 600
prompt and 64 output tokens each, round robin (the detector works under any policy).
The kill drill starts an enginesim fleet and a router, runs streams, kills one instance
while they stream on it and checks every answer: HTTP status, error events, its tokens
(exactly ``max_tokens``, usage adding up) and the longest silence a client saw.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from devharness import Fleet, start_router, wait_until
from engine_interface import percentile
from enginesim.engine.fleet import FleetVariation
from enginesim.replay import metrics
from enginesim.replay.simulator import Fault, RequestResult, SimConfig, Simulator
from enginesim.replay.traces import TraceRecord
from router_worker.routing.grey import GreyParams, GreyState

MODEL = "Qwen/Qwen2-7B-Instruct"


# ----- replay drills -------------------------------------------------------------------------
def steady(instances: int, rate: float, seconds: float) -> list[TraceRecord]:
    every = 1.0 / (rate * instances)
    return [TraceRecord(k, k * every, 600, 64) for k in range(int(seconds / every))]


def _p99(values: Sequence[float]) -> float | None:
    return percentile(list(values), 99) if values else None


def _window(results: list[RequestResult], start: float, end: float) -> list[RequestResult]:
    return [r for r in results if start <= r.arrival_s < end and r.status == "ok"]


def _latencies(done: list[RequestResult]) -> tuple[float | None, float | None]:
    ttft = _p99([metrics.ttft_of(r) for r in done])
    tpot = _p99([metrics.tpot_of(r) for r in done if r.output_tokens > 1])
    return ttft, tpot


def slowed_drill(instances: int, rate: float, seconds: float, factor: float) -> list[dict]:
    """One instance slowed ``factor``x at a third of the run: with and without the
    detector, and the healthy fleet for reference."""
    slow_at, slot = seconds / 3, 3
    records = steady(instances, rate, seconds)
    rows = []
    for label, faults, grey in (
        ("healthy fleet", (), None),
        ("slowed, no detector", (Fault(slow_at, slot, "slow", factor),), None),
        ("slowed, detector", (Fault(slow_at, slot, "slow", factor),), GreyParams(enabled=True)),
    ):
        config = SimConfig(instances=instances, faults=faults, grey=grey)
        run = Simulator(records, "round_robin", config).run()
        changes = [c for c in run.grey_log if c.instance == f"i{slot}"]
        degraded = next((c.at for c in changes if c.after is GreyState.DEGRADED), None)
        drained = next((c.at for c in changes if c.after is GreyState.DRAINED), None)
        settled = slow_at + 60
        after = _window(run.requests, settled, seconds)
        share = sum(r.instance == f"i{slot}" for r in after) / max(1, len(after))
        before = _latencies(_window(run.requests, 0, slow_at))
        during = _latencies(_window(run.requests, slow_at, settled))
        late = _latencies(after)
        rows.append(
            {
                "run": label,
                "detected (s)": None if degraded is None else degraded - slow_at,
                "drained (s)": None if drained is None else drained - slow_at,
                "its share after": share,
                "p99 TTFT before": before[0],
                "p99 TTFT during": during[0],
                "p99 TTFT after": late[0],
                "p99 TPOT before": before[1],
                "p99 TPOT during": during[1],
                "p99 TPOT after": late[1],
                "flagged others": len({c.instance for c in run.grey_log} - {f"i{slot}"}),
            }
        )
    return rows


def false_alarm_drill(
    instances: int, rate: float, seconds: float, seeds: Sequence[int] = (0, 1)
) -> list[dict]:
    """A healthy fleet, heterogeneous by design (a quarter of the instances at 0.6 and a
    quarter at 0.8 of the cost model's speed, step jitter, perturbed coefficients)."""
    quarter = instances // 4
    speeds = (1.0,) * (instances - 2 * quarter) + (0.8,) * quarter + (0.6,) * quarter
    rows = []
    for seed in seeds:
        variation = FleetVariation(speeds=speeds, step_jitter=0.1, perturb=0.1, seed=seed)
        config = SimConfig(
            instances=instances, grey=GreyParams(enabled=True), variation=variation, seed=seed
        )
        run = Simulator(steady(instances, rate, seconds), "round_robin", config).run()
        count = {state: 0 for state in GreyState}
        for change in run.grey_log:
            count[change.after] += 1
        rows.append(
            {
                "seed": seed,
                "replayed (s)": seconds,
                "requests": len(run.requests),
                "suspect": count[GreyState.SUSPECT],
                "degraded": count[GreyState.DEGRADED],
                "drains": count[GreyState.DRAINED],
            }
        )
    return rows


# ----- live kill drill ---------------------------------------------------------------------
@dataclass
class StreamResult:
    instance: str
    status: int
    error: bool
    tokens: int
    usage_ok: bool
    done_events: int
    longest_gap_s: float


async def _stream(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], started: asyncio.Semaphore
) -> StreamResult:
    async with client.stream("POST", url + "/v1/completions", json=body) as response:
        arrivals: list[float] = []
        parts: list[str] = []
        async for part in response.aiter_text():
            if not parts:
                started.release()  # its tokens flow
            arrivals.append(time.perf_counter())
            parts.append(part)
        text = "".join(parts)
        events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
        parsed = [json.loads(e) for e in events if e != "[DONE]"]
        tokens = sum(1 for e in parsed if e.get("choices") and e["choices"][0].get("text"))
        usage: dict[str, Any] = next((e["usage"] for e in parsed if e.get("usage")), {})
        gaps = [b - a for a, b in itertools.pairwise(arrivals)]
        return StreamResult(
            response.headers.get("x-switchyard-instance", ""),
            response.status_code,
            any("error" in e for e in parsed),
            tokens,
            usage.get("completion_tokens") == body["max_tokens"]
            and usage.get("total_tokens") == usage.get("prompt_tokens", 0) + body["max_tokens"],
            events.count("[DONE]"),
            max(gaps, default=0.0),
        )


def kill_drill(instances: int, streams: int, max_tokens: int, time_scale: float) -> list[dict]:
    """``streams`` streams over ``instances`` (round robin), so ``streams / instances`` on
    instance 1 (slowed, so that they last), which is killed once every stream has its
    first tokens."""
    with Fleet(instances, time_scale=time_scale) as fleet, tempfile.TemporaryDirectory() as tmp:
        document = {
            "cluster": "drill",
            "model": MODEL,
            "instances": fleet.instances(),
            "policy": {"kind": "round_robin", "params": {}},
            "router": {"health_interval_s": 0.2, "scrape_interval_s": 0.5, "kv_events": False},
        }
        router = start_router(Path(tmp), document)
        try:
            wait_until(lambda: httpx.get(router.url + "/health").status_code == 200, 10, "up")
            # The victim is slow (its streams last), the others at speed.
            fleet.fault(1, "slow", factor=4)
            results = asyncio.run(_kill_under_streams(fleet, router.url, streams, max_tokens))
        finally:
            fleet.fault(1, "recover")
            router.stop()
    rows = []
    for label, group in (
        ("streams on the killed instance", [r for r in results if r.instance == "i1"]),
        ("all other streams", [r for r in results if r.instance != "i1"]),
    ):
        gaps = sorted(r.longest_gap_s for r in group)
        rows.append(
            {
                "streams": label,
                "count": len(group),
                "client errors": sum(r.status != 200 or r.error for r in group),
                "tokens lost or duplicated": sum(r.tokens != max_tokens for r in group),
                "usage not adding up": sum(not r.usage_ok for r in group),
                "[DONE] != 1": sum(r.done_events != 1 for r in group),
                "longest silence p50 (s)": gaps[len(gaps) // 2] if gaps else None,
                "longest silence max (s)": gaps[-1] if gaps else None,
            }
        )
    return rows


async def _kill_under_streams(
    fleet: Fleet, url: str, streams: int, max_tokens: int
) -> list[StreamResult]:
    async with httpx.AsyncClient(timeout=300) as client:
        bodies = [
            {
                "model": MODEL,
                "prompt": " ".join(f"drill{k}-{i}" for i in range(200)),
                "max_tokens": max_tokens,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            for k in range(streams)
        ]
        started = asyncio.Semaphore(0)
        tasks = [asyncio.create_task(_stream(client, url, b, started)) for b in bodies]
        for _ in tasks:  # every stream past its first token: the kill cuts streams
            await started.acquire()
        await asyncio.to_thread(fleet.fault, 1, "kill")
        return await asyncio.gather(*tasks)


# ----- output --------------------------------------------------------------------------------
def print_table(title: str, rows: list[dict]) -> None:
    print(f"\n### {title}\n")
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "|".join("---" for _ in keys) + "|")
    for row in rows:
        print("| " + " | ".join(_cell(row[k]) for k in keys) + " |")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if value < 10 else f"{value:.1f}"
    return str(value)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("kill", "slowed", "false_alarms"))
    parser.add_argument("--quick", action="store_true", help="smaller drills (a smoke run)")
    parser.add_argument("--instances", type=int, default=16, help="the kill drill's fleet")
    parser.add_argument(
        "--streams", type=int, default=64, help="the kill drill's streams (round robin)"
    )
    parser.add_argument(
        "--seeds", type=int, default=2, help="the false-alarm drill's seeds (one run each)"
    )
    args = parser.parse_args(argv)
    quick = args.quick
    if args.only in (None, "kill"):
        streams = 32 if quick else args.streams
        rows = kill_drill(args.instances, streams, 200, time_scale=0.25)
        title = f"killed instance under streams ({args.instances} instances, {streams} streams)"
        print_table(title + ", live", rows)
    if args.only in (None, "slowed"):
        rows = slowed_drill(8 if quick else 16, 1.0, 300 if quick else 900, 3.0)
        print_table("one instance slowed 3x (replay, 1 req/s per instance)", rows)
    if args.only in (None, "false_alarms"):
        rows = false_alarm_drill(8 if quick else 16, 1.0, 600 if quick else 3600, range(args.seeds))
        print_table("false alarms on a heterogeneous healthy fleet (replay)", rows)


if __name__ == "__main__":
    main()
