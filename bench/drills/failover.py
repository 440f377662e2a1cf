"""Failover drills: a killed instance's streams continued elsewhere (live), an instance
slowed mid-run found and drained (replay), and false alarms on a fleet heterogeneous by
design (replay). Prints one table per drill.

    .venv/bin/python -m bench.drills.failover                  # all three
    .venv/bin/python -m bench.drills.failover --only slowed    # kill | slowed | false_alarms
    .venv/bin/python -m bench.drills.failover --quick          # smaller, for a smoke run

The replay drills run the live router's own detector (``router_worker.routing.grey``) in
the simulator on a steady synthetic load: ``rate`` requests a second per instance, 600
prompt and 64 output tokens each, round robin (the detector works under any policy).
The kill drill starts an enginesim fleet and a router, runs streams and non-streamed
requests, kills one instance while they run on it and checks every answer: HTTP status,
error events, its tokens (exactly ``max_tokens``, usage adding up; a non-streamed
answer's text against the engines' own) and the longest silence a client saw; and each
continued stream's extra latency against the goal's bound (``_continued``). Its fleet runs
at ``--time-scale`` (default 1: the bound is the goal's, unscaled).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from devharness import Fleet, start_router, wait_until
from engine_interface import percentile
from enginesim.engine.fleet import FleetVariation
from enginesim.replay import metrics
from enginesim.replay.policy_costs import derive_coefficients
from enginesim.replay.simulator import Fault, RequestResult, SimConfig, Simulator
from enginesim.replay.traces import TraceRecord
from router_worker.routing.grey import GreyParams, GreyState
from router_worker.routing.policies.predicted_ttft import Coefficients, PredictedTTFTParams

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
SPLICE_ALLOWANCE_S = 0.1  # the goal's "plus 100 ms" over the prefill of what is re-sent
VICTIM_SLOWDOWN = 20


@dataclass
class StreamResult:
    instance: str
    status: int
    error: bool
    tokens: int
    prompt_tokens: int
    usage_ok: bool
    done_events: int
    arrivals: list[float]  # perf_counter of each content-bearing event


@dataclass
class WholeResult:
    reason: str  # x-switchyard-reason: ``continuation`` when it was continued
    status: int
    error: bool
    usage_ok: bool
    text_ok: bool  # the engine's uncut answer, or its first k tokens then a continuation


@dataclass
class ContinuedStream:
    """One stream continued after the kill: what its client saw at the splice."""

    extra_s: float  # from the engine's connections cut to the first token after the splice
    bound_s: float  # predicted prefill of what it re-sent there, plus 100 ms (time-scaled)
    resent_tokens: int


@dataclass
class KillDrill:
    streams: list[dict]  # streams on the killed instance, and all others
    whole: list[dict]  # non-streamed requests continued, and all others
    latency: dict  # the continued streams' extra latency against the goal
    continued: list[ContinuedStream]


def predicted_prefill_s(tokens: int, batch: int, k: Coefficients) -> float:
    """Seconds to prefill ``tokens`` uncached tokens on an instance running ``batch``
    requests, with nothing else queued: the predicted_ttft policy's cost model
    (router_worker/routing/policies/predicted_ttft.py, ``predict``) with the coefficients
    derived from enginesim's cost model for the fleet's GPU and model."""
    steps = max(math.ceil(tokens / max(k.chunk_tokens - batch, 1)), 1)
    step = k.step_overhead_s + batch * k.decode_seq_s
    wait = 0.5 * max(step, k.min_step_s) if batch else 0.0
    busy = steps * step + tokens / k.prefill_tps + k.attention_pair_s * tokens * tokens / 2
    return wait + max(busy, steps * k.min_step_s)


async def _stream(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], started: asyncio.Semaphore
) -> StreamResult:
    arrivals: list[float] = []
    events: list[str] = []
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as response:
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if not events:
                    started.release()  # its tokens flow
                events.append(line[6:])
                if '"text":"' in line and '"text":""' not in line:
                    arrivals.append(time.perf_counter())
    finally:
        if not events:  # refused (or cut) before any event: the kill waits for no more
            started.release()
    parsed = [json.loads(e) for e in events if e != "[DONE]"]
    tokens = sum(1 for e in parsed if e.get("choices") and e["choices"][0].get("text"))
    usage: dict[str, Any] = next((e["usage"] for e in parsed if e.get("usage")), {})
    return StreamResult(
        response.headers.get("x-switchyard-instance", ""),
        response.status_code,
        any("error" in e for e in parsed),
        tokens,
        int(usage.get("prompt_tokens", 0)),
        usage.get("completion_tokens") == body["max_tokens"]
        and usage.get("total_tokens") == usage.get("prompt_tokens", 0) + body["max_tokens"],
        events.count("[DONE]"),
        arrivals,
    )


async def _whole(client: httpx.AsyncClient, url: str, engine: str, body: dict) -> WholeResult:
    """A non-streamed request through the router, its text checked against an engine's:
    enginesim's answer is a function of the prompt, so a continued answer is the uncut
    answer's first k tokens, then what an engine answers to the prompt with those k tokens
    appended."""
    response = await client.post(url + "/v1/completions", json=body)
    answer = response.json()
    usage = answer.get("usage") or {}
    text = (answer.get("choices") or [{}])[0].get("text")
    total = body["max_tokens"]
    return WholeResult(
        response.headers.get("x-switchyard-reason", ""),
        response.status_code,
        "error" in answer,
        usage.get("completion_tokens") == total
        and usage.get("total_tokens") == usage.get("prompt_tokens", 0) + total,
        isinstance(text, str) and await _is_one_answer(client, engine, body, text),
    )


async def _is_one_answer(client: httpx.AsyncClient, engine: str, body: dict, text: str) -> bool:
    pieces = await _engine_pieces(client, engine, body)
    if text == "".join(pieces):
        return True
    agree = 0
    while agree < len(pieces) and text.startswith("".join(pieces[: agree + 1])):
        agree += 1
    # Where the texts part, or up to two tokens before (a continuation may begin with the
    # words the uncut answer had next).
    for k in range(agree, max(0, agree - 3), -1):
        head = "".join(pieces[:k])
        rest = body | {"prompt": body["prompt"] + head, "max_tokens": body["max_tokens"] - k}
        if text == head + "".join(await _engine_pieces(client, engine, rest)):
            return True
    return False


async def _engine_pieces(client: httpx.AsyncClient, engine: str, body: dict) -> list[str]:
    """An engine's answer to ``body``, asked directly, token by token."""
    streamed = body | {"stream": True}
    async with client.stream("POST", engine + "/v1/completions", json=streamed) as response:
        lines = [line[6:] async for line in response.aiter_lines() if line.startswith("data: {")]
    return [t for t in (json.loads(e)["choices"][0].get("text") for e in lines if e) if t]


def kill_drill(
    instances: int, streams: int, max_tokens: int, time_scale: float, whole: int = 0
) -> KillDrill:
    """``streams`` streams and ``whole`` non-streamed requests over ``instances`` (round
    robin), so a share of each on instance 1 (slowed, so that they last), which is killed
    once every stream has its first tokens."""
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
            # The victim is slow, so that its streams are still running when every stream
            # has started (on a loaded host that takes seconds); the others at speed. As
            # slow in wall time at a time scale above 1: slower still, its queued prompts
            # would pass the router's first-byte timeout and go elsewhere before the kill.
            fleet.fault(1, "slow", factor=VICTIM_SLOWDOWN / max(time_scale, 1.0))
            run = _kill_under_streams(fleet, router.url, streams, whole, max_tokens)
            results, wholes, killed_at, cut_at = asyncio.run(run)
        finally:
            fleet.fault(1, "recover")
            router.stop()
        derived = derive_coefficients(fleet.gpu, fleet.model)
        coefficients = Coefficients.of(PredictedTTFTParams.model_validate(derived))
    batch = math.ceil((streams + whole) / instances)  # what the taking-over instance runs
    on_killed = [r for r in results if r.instance == "i1"]
    spliced = (_continued(r, killed_at, cut_at, batch, coefficients, time_scale) for r in on_killed)
    # Streams that were all sent before the kill (the first to start, on a big drill) were
    # not cut: only the spliced ones count.
    continued = [c for c in spliced if math.isfinite(c.bound_s)]
    return KillDrill(
        [_stream_row(label, group, max_tokens) for label, group in _by_victim(results)],
        [
            _whole_row(
                "non-streamed, continued", [w for w in wholes if w.reason == "continuation"]
            ),
            _whole_row("non-streamed, others", [w for w in wholes if w.reason != "continuation"]),
        ],
        _latency_row(continued, cut_at - killed_at),
        continued,
    )


def _by_victim(results: list[StreamResult]) -> list[tuple[str, list[StreamResult]]]:
    return [
        ("streams on the killed instance", [r for r in results if r.instance == "i1"]),
        ("all other streams", [r for r in results if r.instance != "i1"]),
    ]


def _stream_row(label: str, group: list[StreamResult], max_tokens: int) -> dict:
    gaps = sorted(
        max((b - a for a, b in itertools.pairwise(r.arrivals)), default=0.0) for r in group
    )
    return {
        "requests": label,
        "count": len(group),
        "client errors": sum(r.status != 200 or r.error for r in group),
        "tokens lost or duplicated": sum(r.tokens != max_tokens for r in group),
        "usage not adding up": sum(not r.usage_ok for r in group),
        "[DONE] != 1": sum(r.done_events != 1 for r in group),
        "longest silence p50 (s)": gaps[len(gaps) // 2] if gaps else None,
        "longest silence max (s)": gaps[-1] if gaps else None,
    }


def _whole_row(label: str, group: list[WholeResult]) -> dict:
    return {
        "requests": label,
        "count": len(group),
        "client errors": sum(w.status != 200 or w.error for w in group),
        "tokens lost or duplicated": sum(not w.text_ok for w in group),
        "usage not adding up": sum(not w.usage_ok for w in group),
    }


def _continued(
    result: StreamResult,
    killed_at: float,
    cut_at: float,
    batch: int,
    k: Coefficients,
    time_scale: float,
) -> ContinuedStream:
    """The splice of a stream the kill cut: the longest silence that ends after the kill
    (from the last token before the failure to the first after it), counted from the
    moment the dead engine's connections were cut (``cut_at``, seen on a stream of the
    drill's own straight to it), or from the kill's start when that was seen only later
    (conservative). A process that dies stops its tokens as its connections close, on
    average half a token gap after the last one; from the cut, the extra latency is never
    below the silence the client saw less its normal token gap. (enginesim stops a killed
    instance's tokens first and closes its connections once its admin call is served, tens
    to hundreds of ms later on a loaded host: no part of the router's time.) The bound:
    the predicted prefill of the prompt and the tokens sent before the splice on the
    instance that took over, plus 100 ms, in wall seconds at the fleet's time scale (its
    simulated durations take ``time_scale`` wall seconds each; the bound is scaled
    alike)."""
    gaps = list(itertools.pairwise(result.arrivals))
    ends = [j for j, (_, b) in enumerate(gaps) if b > killed_at]
    if not ends:  # its last tokens came before the kill: nothing was spliced
        return ContinuedStream(0.0, math.inf, 0)
    splice = max(ends, key=lambda j: gaps[j][1] - gaps[j][0])
    first_after = gaps[splice][1]
    start = cut_at if killed_at <= cut_at < first_after else killed_at
    resent = result.prompt_tokens + splice + 1  # the tokens before the splice
    bound = (predicted_prefill_s(resent, batch, k) + SPLICE_ALLOWANCE_S) * time_scale
    return ContinuedStream(first_after - start, bound, resent)


def _latency_row(continued: list[ContinuedStream], cut_after_s: float) -> dict:
    extra = [c.extra_s for c in continued]
    bounds = [c.bound_s for c in continued if math.isfinite(c.bound_s)]
    return {
        "streams continued": len(continued),
        "kill to cut (s)": cut_after_s if math.isfinite(cut_after_s) else None,
        "extra latency p50 (s)": percentile(extra, 50) if extra else None,
        "extra latency max (s)": max(extra, default=None),
        "extra latency p99 (s)": _p99(extra),
        "bound min (s)": min(bounds, default=None),
        "bound max (s)": max(bounds, default=None),
        "over their bound": sum(c.extra_s > c.bound_s for c in continued),
    }


async def _kill_under_streams(
    fleet: Fleet, url: str, streams: int, whole: int, max_tokens: int
) -> tuple[list[StreamResult], list[WholeResult], float, float]:
    """The streams' and the non-streamed requests' results, when the kill began and when
    the killed engine's connections were cut (seen by a thread of the drill's own reading
    a stream straight from it: the client's event loop, busy with every stream, would see
    it late)."""

    def body(k: int) -> dict[str, Any]:
        prompt = " ".join(f"drill{k}-{i}" for i in range(200))
        return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens}

    usage = {"stream": True, "stream_options": {"include_usage": True}}
    loop = asyncio.get_running_loop()
    async with httpx.AsyncClient(timeout=300) as client:
        started = asyncio.Semaphore(0)
        flowing = partial(loop.call_soon_threadsafe, started.release)
        witness = asyncio.create_task(
            asyncio.to_thread(_cut_witness, fleet.url(1), body(-1), flowing)
        )
        tasks = [
            asyncio.create_task(_stream(client, url, body(k) | usage, started))
            for k in range(streams)
        ]
        engine = fleet.url(0)
        wholes = [
            asyncio.create_task(_whole(client, url, engine, body(streams + k)))
            for k in range(whole)
        ]
        for _ in range(streams + 1):  # every stream past its first token: the kill cuts them
            await started.acquire()
        killed_at = time.perf_counter()
        await asyncio.to_thread(fleet.fault, 1, "kill")
        results, answers = await asyncio.gather(*tasks), await asyncio.gather(*wholes)
        return results, answers, killed_at, await witness


def _cut_witness(engine: str, body: dict[str, Any], flowing: Callable[[], Any]) -> float:
    """A stream straight to the engine to be killed: when its connection was cut (inf:
    it was not)."""
    streamed = body | {"stream": True, "max_tokens": 2000}
    told = False
    try:
        with httpx.stream("POST", engine + "/v1/completions", json=streamed, timeout=300) as answer:
            for _ in answer.iter_lines():
                if not told:
                    flowing()
                    told = True
    except httpx.TransportError:
        return time.perf_counter()
    finally:
        if not told:  # it never flowed: the kill waits for it no more
            flowing()
    return math.inf  # it ended without being cut: no sighting of the cut


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
        "--time-scale",
        type=float,
        default=1.0,
        help="the kill drill's fleet: wall seconds per simulated second (the latency bound "
        "is scaled alike)",
    )
    parser.add_argument(
        "--seeds", type=int, default=2, help="the false-alarm drill's seeds (one run each)"
    )
    args = parser.parse_args(argv)
    quick = args.quick
    if args.only in (None, "kill"):
        streams = 32 if quick else args.streams
        whole = 2 * args.instances
        drill = kill_drill(args.instances, streams, 200, args.time_scale, whole)
        title = (
            f"killed instance ({args.instances} instances, {streams} streams, {whole} non-streamed)"
        )
        print_table(title + ", live: streams", drill.streams)
        print_table(title + ", live: non-streamed requests", drill.whole)
        bound = f"predicted prefill of the re-sent tokens + {SPLICE_ALLOWANCE_S * 1000:g} ms"
        scale = f"x time scale {args.time_scale:g}" if args.time_scale != 1 else ""
        print_table(f"continued streams' extra latency (bound: {bound} {scale})", [drill.latency])
    if args.only in (None, "slowed"):
        rows = slowed_drill(8 if quick else 16, 1.0, 300 if quick else 900, 3.0)
        print_table("one instance slowed 3x (replay, 1 req/s per instance)", rows)
    if args.only in (None, "false_alarms"):
        rows = false_alarm_drill(8 if quick else 16, 1.0, 600 if quick else 3600, range(args.seeds))
        print_table("false alarms on a heterogeneous healthy fleet (replay)", rows)


if __name__ == "__main__":
    main()
