"""The latency rows of bench/bench_router.py: the TTFT a router adds to a stream, measured
against direct streams run at the same time (TTFT rows) and by a separate prober through a
canary arm of its own (prober rows); bench_router.py's docstring explains both methods."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import multiprocessing
import subprocess
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.lib.cpu import cpu_seconds, cpu_ticks, renice, runnable_wait_seconds, steal_share
from bench.lib.loadclient import Run, run_async, run_loop
from bench.lib.prober import (
    PROBE_MAX_TOKENS,
    PROBE_TIME_SCALE,
    ProbeEngine,
    ProbePlan,
    ProbeResult,
    probe_loop,
    probe_transits,
    prober,
    sessions_in_arm,
)
from bench.lib.processes import BenchStack, nginx_in_front, paused
from bench.lib.stats import added_interval, bucket_quantile, pct, router_histograms, transit


@dataclass
class ArmResult:
    """A TTFT row through one router: its streams, the direct probe streams run at the same
    time, the engines' own TTFT of both, and the router's CPU share, runnable-wait share
    and own histograms."""

    routed: Run
    direct: Run
    engine_ttft: dict[str, float]
    cpu: float
    cpu_wait: float
    side: list[float]  # overhead p50, p99, loop lag p50, p99 (s, bucket upper bounds)
    steal: float  # share of the machine's CPU time the hypervisor took during the row

    def transit(self, run: Run) -> list[float]:
        return transit(run, self.engine_ttft)


def router_meter(proc: subprocess.Popen[bytes], port: int) -> Callable[[float], dict[str, Any]]:
    """Start measuring the router ``proc`` (serving on ``port``) over a row; the function
    returned, given the row's wall time, reads the row's router side: its CPU share
    (``cpu``), runnable-without-CPU share (``cpu_wait``), its histograms' overhead and loop
    lag p50/p99 (``side``) and the share of the machine's CPU the hypervisor took (``steal``)."""
    cpu0, wait0 = cpu_seconds(proc.pid), runnable_wait_seconds(proc.pid)
    before, ticks = router_histograms(port), cpu_ticks()

    def read(wall: float) -> dict[str, Any]:
        after = router_histograms(port)
        return {
            "cpu": (cpu_seconds(proc.pid) - cpu0) / wall,
            "cpu_wait": (runnable_wait_seconds(proc.pid) - wait0) / wall,
            "side": [
                bucket_quantile(before, after, name, q)
                for name in ("overhead", "loop_lag")
                for q in (50, 99)
            ],
            "steal": steal_share(ticks, cpu_ticks()),
        }

    return read


def row_streams(
    args: argparse.Namespace, ports: list[int], streams: int, sessions: list[str] | None = None
) -> Coroutine[Any, Any, Run]:
    """A latency row's closed loop of ``streams`` streams to ``ports``, shaped by the
    bench's options (prompt, shared prefix, answer length, ramp, duration)."""
    return run_loop(
        ports,
        streams,
        args.ttft_duration,
        True,
        args.max_tokens,
        args.prompt_tokens,
        args.ttft_warmup,
        args.shared_prefix_tokens,
        sessions,
    )


def ttft_arm(
    setup: BenchStack, policy: str, concurrency: int, args: argparse.Namespace
) -> ArmResult:
    """``concurrency`` streams through the ``policy`` router and, at the same time, a
    quarter as many straight to the engines (the baseline: the same engines, client and
    moment, so what the machine does to both cancels out)."""
    port, proc = setup.routers[policy]
    probes = max(1, round(concurrency * args.probe_share))

    async def both() -> tuple[Run, Run]:
        return await asyncio.gather(
            row_streams(args, [port], concurrency), row_streams(args, setup.ports, probes)
        )

    meter = router_meter(proc, port)
    routed, direct = run_async(both())
    measured = meter(routed.wall)
    engine = setup.engine_log.engine_ttft(routed) | setup.engine_log.engine_ttft(direct)
    return ArmResult(routed, direct, engine, **measured)


def ttft_rows(setup: BenchStack, args: argparse.Namespace) -> None:
    """Added TTFT at 1, 50 and 200 concurrent streams through the round-robin and the
    lmetric router, each against direct probe streams run at the same time.

    Client-observed TTFT includes the engines' queueing and prefill, which differ between
    runs by far more than a millisecond (and between policies by design). So each stream's
    *transit* is measured: client TTFT minus the engine's own TTFT for that request (from
    its ``--request-log``, joined on X-Request-Id, one monotonic clock). Added = routed
    transit − direct transit, per percentile: everything the router costs a stream on its
    way to its first token, queueing in the router's event loop included."""
    print(
        f"\nTTFT, streams of {args.prompt_tokens}-token prompts ({args.shared_prefix_tokens} "
        f"of them a shared system prompt) and {args.max_tokens}-token answers, enginesim "
        f"time scale {args.ttft_time_scale:g}, {args.ttft_warmup:g}s ramp then "
        f"{args.ttft_duration:g}s closed loop per row; direct = {args.probe_share:.0%} as "
        "many streams straight to the engines at the same time (ms). engine = the engine's "
        "own TTFT (handler start → first token chunk); transit = client TTFT − engine TTFT; "
        "added = routed transit − direct transit, with its 95% bootstrap interval; own = "
        "the router's histogram of its time in the first chunk, lag = how late its event "
        "loop runs a due timer (bucket upper bounds); CPU = router process CPU, wait = its "
        "runnable-without-CPU share, steal = the share of the machine's CPU time the "
        "hypervisor took (rows with a few % of it are slowed by other tenants)"
    )
    header = (
        f"{'streams':>7} {'router':>11} {'n':>5} {'direct n':>8} {'TTFT p50':>9} "
        f"{'p99':>7} {'direct p50':>10} {'p99':>7} {'engine p50':>10} {'p99':>7} "
        f"{'transit p50':>11} {'p99':>6} {'direct p50':>10} {'p99':>6} "
        f"{'added p50':>9} {'95% interval':>15} {'p99':>6} {'95% interval':>15} "
        f"{'own p50':>7} {'p99':>5} "
        f"{'lag p50':>7} {'p99':>5} {'CPU':>4} {'wait':>4} {'steal':>5}"
    )
    each_row(
        setup,
        args,
        header,
        lambda streams, policy: ttft_line(streams, policy, ttft_arm(setup, policy, streams, args)),
    )


def each_row(
    setup: BenchStack, args: argparse.Namespace, header: str, row: Callable[[int, str], str]
) -> None:
    """Print ``header`` and a row per stream count and router, the other router paused."""
    print(header)
    print("-" * len(header))
    for concurrency in args.concurrency or (1, 50, 200):
        for policy in ("round_robin", "lmetric"):
            with paused(r for p, r in setup.routers.items() if p != policy):
                line = row(concurrency, policy)
            print(line, flush=True)


def reference_hop(probe: ProbeEngine, args: argparse.Namespace, workdir: Path) -> str:
    """The prober's added TTFT through nginx instead of the router, with no load: what any
    extra loopback hop through a proxy costs on this machine (the floor of the rows)."""
    with nginx_in_front(probe.port, workdir) as port:
        if port is None:
            return "reference: nginx is not installed (apt install nginx-light), row skipped"
        plan = ProbePlan(
            port,
            probe.port,
            "",
            time.monotonic() + 1.0,
            args.ttft_duration,
            args.probe_rate,
            args.prompt_tokens,
            args.shared_prefix_tokens,
        )
        ticks = cpu_ticks()
        routed, direct, _, failures = probe_transits(run_async(probe_loop(plan)), probe)
        steal = steal_share(ticks, cpu_ticks())
    return (
        f"reference: the same probes through nginx (C, one worker) instead of a router, "
        f"no load: n {len(routed)}/{len(direct)}, added p50 "
        f"{pct(routed, 50) - pct(direct, 50):.2f} {added_interval(routed, direct, 50)}, "
        f"p99 {pct(routed, 99) - pct(direct, 99):.2f} {added_interval(routed, direct, 99)}, "
        f"steal {steal:.1%}" + (f" ({failures} failed)" if failures else "")
    )


def probe_arm(
    setup: BenchStack, probe: ProbeEngine, policy: str, concurrency: int, args: argparse.Namespace
) -> ProbeResult:
    """``concurrency`` load streams through the ``policy`` router's load arm while a
    separate prober process times probes through its probe arm and direct."""
    port, proc = setup.routers[policy]
    load_sessions = list(itertools.islice(sessions_in_arm("load", 0, 99), concurrency))
    plan = ProbePlan(
        port,
        probe.port,
        next(sessions_in_arm("probe", 99, 100)),
        time.monotonic() + args.ttft_warmup,
        args.ttft_duration,
        args.probe_rate,
        args.prompt_tokens,
        args.shared_prefix_tokens,
    )
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=prober, args=(plan, sender))
    process.start()
    assert process.pid is not None  # started
    if args.router_nice:  # else a prioritised router would delay the prober's direct probes
        renice(process.pid, args.router_nice)  # (allowed: the routers' renice was)
    meter = router_meter(proc, port)
    load = run_async(row_streams(args, [port], concurrency, load_sessions))
    results = receiver.recv()
    process.join()
    return ProbeResult(load, *probe_transits(results, probe), **meter(load.wall))


def probe_rows(
    setup: BenchStack, probe: ProbeEngine, args: argparse.Namespace, workdir: Path
) -> None:
    """Added TTFT as a prober sees it while the router carries 1, 50 or 200 streams.

    The TTFT rows' direct baseline goes to the loaded engines, whose event loop (4
    instances, hundreds of streams) delays both paths' chunks by milliseconds, and it
    shares the load client's event loop: at 200 streams their noise hides a millisecond.
    Here the load runs through the router's ``load`` arm as before, and a separate prober
    process sends probes through the router's ``probe`` arm and straight to an idle probe
    engine of their own, alternately: both paths see the same idle engine and idle client,
    and only the routed one crosses the loaded router. Added = routed − direct transit per
    percentile; what it measures is the router's cost to one more request while it carries
    that load (its CPU, its event loop's queue, the extra loopback hop)."""
    print(
        f"\nAdded TTFT seen by a prober: a separate process sends {args.probe_rate:g} probes/s "
        f"({args.prompt_tokens}-token prompts, {PROBE_MAX_TOKENS}-token answers), half through "
        "the router's probe arm and half straight to an idle probe engine of their own "
        f"(time scale {PROBE_TIME_SCALE:g}), while the router's load arm carries the streams "
        f"of the TTFT rows ({args.ttft_warmup:g}s ramp, then {args.ttft_duration:g}s "
        "measured; ms; added = routed − direct probe transit with its 95% bootstrap "
        "interval; own, lag, CPU, wait, steal as above)"
    )
    header = (
        f"{'streams':>7} {'router':>11} {'load req/s':>10} {'chunks/s':>8} "
        f"{'probes':>9} {'engine p50':>10} {'routed p50':>10} {'p99':>6} "
        f"{'direct p50':>10} {'p99':>6} {'added p50':>9} {'95% interval':>15} "
        f"{'p99':>6} {'95% interval':>15} {'own p50':>7} {'p99':>5} {'lag p50':>7} "
        f"{'p99':>5} {'CPU':>4} {'wait':>4} {'steal':>5}"
    )
    each_row(
        setup,
        args,
        header,
        lambda streams, policy: probe_line(
            streams, policy, probe_arm(setup, probe, policy, streams, args)
        ),
    )
    with paused(setup.routers.values()):
        print(reference_hop(probe, args, workdir), flush=True)


def probe_line(concurrency: int, policy: str, result: ProbeResult) -> str:
    routed, direct, load = result.routed, result.direct, result.load
    own50, own99, lag50, lag99 = (f"≤{v * 1000:g}" for v in result.side)
    failures = result.failures + load.failures
    return (
        f"{concurrency:>7} {policy:>11} {len(load.outcomes) / load.elapsed:>10.1f} "
        f"{load.events / load.elapsed:>8.0f} {f'{len(routed)}/{len(direct)}':>9} "
        f"{pct(result.engine, 50):>10.2f} {pct(routed, 50):>10.2f} {pct(routed, 99):>6.2f} "
        f"{pct(direct, 50):>10.2f} {pct(direct, 99):>6.2f} "
        f"{pct(routed, 50) - pct(direct, 50):>9.2f} "
        f"{added_interval(routed, direct, 50):>15} "
        f"{pct(routed, 99) - pct(direct, 99):>6.2f} {added_interval(routed, direct, 99):>15} "
        f"{own50:>7} {own99:>5} {lag50:>7} {lag99:>5} {result.cpu:>4.0%} "
        f"{result.cpu_wait:>4.0%} {result.steal:>5.1%}"
        + (f"  ({failures} failed)" if failures else "")
    )


def ttft_line(concurrency: int, policy: str, arm: ArmResult) -> str:
    routed, direct = arm.routed, arm.direct
    moved, base = arm.transit(routed), arm.transit(direct)
    engine = [
        arm.engine_ttft[o.request_id] for o in routed.outcomes if o.request_id in arm.engine_ttft
    ]
    own50, own99, lag50, lag99 = (f"≤{v * 1000:g}" for v in arm.side)
    failures = routed.failures + direct.failures
    return (
        f"{concurrency:>7} {policy:>11} {len(routed.outcomes):>5} "
        f"{len(direct.outcomes):>8} {pct(routed.samples, 50):>9.1f} "
        f"{pct(routed.samples, 99):>7.1f} {pct(direct.samples, 50):>10.1f} "
        f"{pct(direct.samples, 99):>7.1f} {pct(engine, 50):>10.1f} {pct(engine, 99):>7.1f} "
        f"{pct(moved, 50):>11.2f} {pct(moved, 99):>6.2f} {pct(base, 50):>10.2f} "
        f"{pct(base, 99):>6.2f} {pct(moved, 50) - pct(base, 50):>9.2f} "
        f"{added_interval(moved, base, 50):>15} {pct(moved, 99) - pct(base, 99):>6.2f} "
        f"{added_interval(moved, base, 99):>15} {own50:>7} {own99:>5} {lag50:>7} "
        f"{lag99:>5} {arm.cpu:>4.0%} {arm.cpu_wait:>4.0%} {arm.steal:>5.1%}"
        + (f"  ({failures} failed)" if failures else "")
    )
