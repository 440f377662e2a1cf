"""What the router adds: TTFT at 1/50/200 concurrent streams and requests/s, vs enginesim direct.

Processes: ``python -m enginesim serve`` (4 instances, with ``--request-log``), two
``python -m router_worker`` in front of it (round_robin and lmetric), and this load
generator (raw sockets parsed with httptools on uvloop, so the client stays cheap; one
keep-alive connection per worker and port, re-opened when the server closed it idle).

TTFT rows. Each stream sends a 1000-token prompt (900 of them a system prompt shared by
the run, which the engines cache and the router still tokenizes and hashes) for a
128-token answer — the Azure conversation trace's median request — at the engines' real
speed (time scale 1), closed loop, the streams starting spread over a 10 s ramp that is
not measured. Client TTFT (request sent → first SSE line carrying a token) is dominated by
the engines' queueing and prefill, which vary between runs by far more than a millisecond,
so every stream's *transit* is measured: client TTFT minus the engine's own TTFT for that
request (handler start → first token chunk, from enginesim's request log, joined on
X-Request-Id; one monotonic clock). The baseline is direct *probe* streams (a quarter as
many) sent by the same client to the same engines at the same time, so what the machine
does during the run weighs on both. Added = routed transit − probe transit, per
percentile. Beside it, the router's own view: its ``switchyard_router_overhead_seconds``
histogram (handler start → upstream request, plus the first chunk's relay), its event
loop's lag (how late a 10 ms timer fires: what a readable socket waits before it is read,
which the histogram cannot see), its CPU share and its runnable-without-CPU share. The
router not under test is paused (SIGSTOP), so its scrapes do not load the engines.
Placement (``--placement``): by default the engines get CPU 0 and the client shares the
other CPU with the routers. The load client stands in for users on other machines: a
deployed router does not share its cores with them. So the routers run at nice -10 there
(``--router-nice``, as nginx's ``worker_priority`` does; needs root), which gives them the
CPU whenever they are runnable. The load they carry, their own CPU and their event loop's
queue all stay in the figures; only the client's claim on their core goes. ``--router-nice
0`` measures the router as the client's equal on that core (what that costs on one machine:
bench/router.md).
``router-apart`` gives the routers a CPU of their own and the client shares the engines';
``shared`` pins nothing. ``--ttft-time-scale 2`` runs the engines at half speed (half the
requests and chunks per second for the same number of streams).

Prober rows (the precise added-TTFT figure). The TTFT rows' baseline shares the loaded
engines' event loop and the load client's, whose delays at 200 streams are milliseconds
wide. Here the routers get a canary config: a ``load`` arm (weight 99) over the engines and
a ``probe`` arm (weight 1) over a one-instance enginesim of its own; the load streams carry
session keys of the load arm. A separate prober process (its event loop idle between
probes) sends ``--probe-rate`` probes/s with Poisson gaps, alternately through the router's
probe arm and straight to the probe engine, and each probe's transit is its client TTFT
minus the probe engine's own TTFT. Both paths see the same idle engine and idle client;
only the routed one crosses the router that carries the load, so added = routed − direct
transit is the router's cost to one more request at that load: its CPU, its event loop's
queue and the extra loopback hop. (The probe arm's policy chooses among one instance, the
load arm's among four: the decision is the same code, a few µs cheaper.) A last row sends
the same probes through nginx instead, with no load: the floor any extra hop through a
proxy costs on this machine (skipped when nginx is not installed; it is not a dependency).

Throughput: closed-loop non-streamed requests (``max_tokens`` 4) at 64 in flight, engines
at 20× speed (``--time-scale 0.05``). Time shares: the router's own histograms (tokenize,
hash, decide) against the router process's CPU time per request. CPU cost (the figure that
stays comparable on a shared machine): process CPU time (``/proc/<pid>/stat``) of the
router and of enginesim serving the same load directly, per non-streamed request, per
stream (intercept) and per SSE chunk (slope between 4- and 64-token streams), at 32 in
flight. Fast engines send chunks in bursts the router coalesces; at real speed each chunk
comes alone and costs the router a read and a write (see the TTFT rows' CPU column).

    .venv/bin/python bench/bench_router.py [--only probe] [--concurrency 200] [--router-nice 0]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import multiprocessing
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.lib.cpu import (
    PLACEMENTS,
    cpu_seconds,
    cpu_ticks,
    placed,
    prioritised,
    renice,
    runnable_wait_seconds,
    steal_share,
)
from bench.lib.loadclient import Run, closed_loop, run_async, run_loop
from bench.lib.prober import (
    PROBE_MAX_TOKENS,
    PROBE_TIME_SCALE,
    ProbeEngine,
    ProbePlan,
    ProbeResult,
    probe_engine,
    probe_loop,
    probe_transits,
    prober,
    sessions_in_arm,
)
from bench.lib.processes import INSTANCES, Cluster, cluster, nginx_in_front, paused
from bench.lib.stats import added_interval, bucket_quantile, pct, router_histograms, transit


def hot_path_rows() -> None:
    """Tokenize + hash + decide in-process (CPU time, no network): the stable figure."""
    from router_worker.routing import ClusterState, build_features, make_policy
    from router_worker.tokenization import Tokenizer

    print(
        "\nHot path in-process, lmetric over 16 instances with a warm KV index (CPU µs per request)"
    )
    print(f"{'prompt chars':>12} {'tokenize':>9} {'hash':>7} {'decide':>7} {'total':>7}")
    tokenizer = Tokenizer()
    for chars in (400, 4000, 32000):
        state = ClusterState(block_size=16)
        for k in range(16):
            state.add_instance(f"i{k}")
        policy = make_policy("lmetric", {}, 0)
        view = state.view()
        shared = "system prompt " * (chars // 28)
        timings = np.zeros(3)
        rounds = 2000
        for n in range(rounds):
            t0 = time.process_time()
            ids, _ = tokenizer.encode_chat(
                [
                    {"role": "system", "content": shared},
                    {"role": "user", "content": f"question {n}"},
                ]
            )
            t1 = time.process_time()
            features = build_features(f"r{n}", ids, n * 0.01)
            t2 = time.process_time()
            decision = policy.decide(features, view, n * 0.01)
            t3 = time.process_time()
            state.on_dispatch(
                features, decision.instance_id, n * 0.01, cached_tokens=decision.cached_tokens
            )
            state.on_finish(features.request_id, n * 0.01)
            timings += (t1 - t0, t2 - t1, t3 - t2)
        tok, hashing, decide = timings / rounds * 1e6
        print(
            f"{chars:>12} {tok:>9.1f} {hashing:>7.1f} {decide:>7.1f} {tok + hashing + decide:>7.1f}"
        )


def measure_cpu(
    ports: list[int], pid: int, concurrency: int, duration: float, stream: bool, max_tokens: int
) -> tuple[Run, float]:
    """A closed-loop run and the CPU seconds process ``pid`` spent during it."""
    cpu0 = cpu_seconds(pid)
    run = run_async(run_loop(ports, concurrency, duration, stream, max_tokens))
    return run, cpu_seconds(pid) - cpu0


def cpu_rows(
    ports: list[int],
    router_port: int,
    router: subprocess.Popen[bytes],
    engines: subprocess.Popen[bytes],
    args: argparse.Namespace,
) -> None:
    """CPU time per request and per streamed chunk: the robust figure on a shared machine.

    Per chunk: the slope between streams of ``SHORT`` and ``LONG`` tokens (CPU per request
    against SSE events per request), so the fixed per-request part drops out; per stream:
    the intercept. Router rows: the router process only (enginesim's CPU is not in them);
    direct rows: the enginesim process serving the same requests without the router.
    """
    short, long_, concurrency = 4, 64, 32
    print(
        f"\nCPU time per request and per SSE chunk (µs of process CPU, /proc/<pid>/stat), "
        f"{concurrency} in flight, load average {os.getloadavg()[0]:.1f}"
    )
    header = (
        f"{'process':>20} {'non-stream/req':>14} {f'stream {short} tok/req':>16} "
        f"{f'stream {long_} tok/req':>17} {'per stream':>10} {'per chunk':>9}"
    )
    print(header)
    print("-" * len(header))
    rows = {}
    for label, targets, pid in (
        ("enginesim (direct)", ports, engines.pid),
        ("router", [router_port], router.pid),
    ):
        whole, whole_cpu = measure_cpu(targets, pid, concurrency, args.duration, False, short)
        values = [whole_cpu / max(len(whole.samples), 1)]
        points = []
        for tokens in (short, long_):
            run, cpu = measure_cpu(targets, pid, concurrency, args.duration, True, tokens)
            count = max(len(run.samples), 1)
            points.append((run.events / count, cpu / count))
            values.append(cpu / count)
        (e0, c0), (e1, c1) = points
        per_chunk = (c1 - c0) / (e1 - e0) if e1 > e0 else float("nan")
        values += [c0 - per_chunk * e0, per_chunk]
        rows[label] = values
        print(
            f"{label:>20} "
            + " ".join(
                f"{v * 1e6:>{w}.0f}" for v, w in zip(values, (14, 16, 17, 10, 9), strict=True)
            ),
            flush=True,
        )
    ratio = [
        r / d if d else float("nan")
        for r, d in zip(rows["router"], rows["enginesim (direct)"], strict=True)
    ]
    print(
        f"{'router / direct':>20} "
        + " ".join(f"{v:>{w}.2f}" for v, w in zip(ratio, (14, 16, 17, 10, 9), strict=True))
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--duration", type=float, default=6.0, help="seconds per run of the throughput and CPU rows"
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=0.05,
        help="enginesim time scale of the throughput and CPU rows",
    )
    parser.add_argument(
        "--ttft-duration", type=float, default=20.0, help="seconds per arm and row of the TTFT rows"
    )
    parser.add_argument(
        "--ttft-warmup",
        type=float,
        default=10.0,
        help="seconds over which a TTFT row's streams start, not measured",
    )
    parser.add_argument(
        "--ttft-time-scale",
        type=float,
        default=1.0,
        help="enginesim time scale of the TTFT rows (1: an H20's speed)",
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=128,
        help="answer length of the TTFT rows (the Azure conversation "
        "trace's median output is 129 tokens)",
    )
    parser.add_argument(
        "--prompt-tokens",
        type=int,
        default=1000,
        help="prompt length of the TTFT rows (that trace's median input is 1,020 tokens)",
    )
    parser.add_argument(
        "--shared-prefix-tokens",
        type=int,
        default=900,
        help="of which a system prompt shared by all requests of a run (the "
        "engines cache it; the router still tokenizes and hashes it)",
    )
    parser.add_argument(
        "--probe-share",
        type=float,
        default=0.25,
        help="direct streams run beside a TTFT row's routed ones, as a share "
        "of them (at least one)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        action="append",
        help="TTFT rows' concurrent streams (repeatable; default 1, 50, 200)",
    )
    parser.add_argument(
        "--probe-rate",
        type=float,
        default=20.0,
        help="probes per second of the prober rows (half through the router)",
    )
    parser.add_argument(
        "--only",
        choices=("ttft", "probe", "throughput", "cpu", "hot-path"),
        action="append",
        help="run only these sections (repeatable)",
    )
    parser.add_argument(
        "--placement",
        choices=sorted(PLACEMENTS),
        default="engines-apart",
        help="CPU pinning for the TTFT rows (throughput and CPU rows: shared)",
    )
    parser.add_argument(
        "--router-nice",
        type=int,
        default=-10,
        help="scheduling niceness of the routers (and the prober) in the TTFT "
        "and prober rows: negative, they preempt the load client on a "
        "shared CPU, as on a host of their own; needs root or "
        "CAP_SYS_NICE, else 0. 0: the router shares its CPU with the "
        "client as an equal",
    )
    args = parser.parse_args()
    sections = set(args.only or ("ttft", "probe", "throughput", "cpu", "hot-path"))
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    print(f"# router overhead vs enginesim direct ({machine})")
    print(f"# load average at start: {os.getloadavg()[0]:.1f}")
    print(
        f"# {INSTANCES} enginesim instances h20/qwen2-7b; routers lmetric and round_robin, "
        "approx tokenizer"
    )
    with tempfile.TemporaryDirectory() as tmp:
        if "ttft" in sections:
            with cluster(args.ttft_time_scale, Path(tmp)) as slow:
                engines = slow.engines
                routers = [proc for _, proc in slow.routers.values()]
                with (
                    placed(args.placement, engines, routers) as placement,
                    prioritised(routers, args.router_nice) as args.router_nice,
                ):
                    print(f"\n# TTFT rows: {placement}; routers at nice {args.router_nice}")
                    ttft_rows(slow, args)
        if "probe" in sections:
            with (
                probe_engine(Path(tmp)) as probe,
                cluster(args.ttft_time_scale, Path(tmp), probe.url) as slow,
            ):
                routers = [proc for _, proc in slow.routers.values()]
                with (
                    placed(args.placement, slow.engines, routers) as placement,
                    prioritised(routers, args.router_nice) as args.router_nice,
                ):
                    print(
                        f"\n# prober rows: {placement}; routers and prober at nice "
                        f"{args.router_nice}; "
                        "the prober and its engine are not pinned"
                    )
                    probe_rows(slow, probe, args, Path(tmp))
        if sections & {"throughput", "cpu"}:
            with cluster(args.time_scale, Path(tmp)) as fast:
                router_port, router = fast.routers["lmetric"]
                if "throughput" in sections:
                    throughput_rows(fast.ports, router_port, router, fast.engines, args)
                if "cpu" in sections:
                    cpu_rows(fast.ports, router_port, router, fast.engines, args)
    if "hot-path" in sections:
        hot_path_rows()


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


def ttft_arm(setup: Cluster, policy: str, concurrency: int, args: argparse.Namespace) -> ArmResult:
    """``concurrency`` streams through the ``policy`` router and, at the same time, a
    quarter as many straight to the engines (the baseline: the same engines, client and
    moment, so what the machine does to both cancels out)."""
    port, proc = setup.routers[policy]
    probes = max(1, round(concurrency * args.probe_share))

    def loop(ports: list[int], streams: int) -> Coroutine[Any, Any, Run]:
        return run_loop(
            ports,
            streams,
            args.ttft_duration,
            True,
            args.max_tokens,
            args.prompt_tokens,
            args.ttft_warmup,
            args.shared_prefix_tokens,
        )

    async def both() -> list[Run]:
        return await asyncio.gather(loop([port], concurrency), loop(setup.ports, probes))

    cpu0, wait0, before = (
        cpu_seconds(proc.pid),
        runnable_wait_seconds(proc.pid),
        router_histograms(port),
    )
    ticks = cpu_ticks()
    routed, direct = run_async(both())
    after = router_histograms(port)
    engine = setup.engine_log.engine_ttft(routed) | setup.engine_log.engine_ttft(direct)
    return ArmResult(
        routed,
        direct,
        engine,
        cpu=(cpu_seconds(proc.pid) - cpu0) / routed.wall,
        cpu_wait=(runnable_wait_seconds(proc.pid) - wait0) / routed.wall,
        side=[
            bucket_quantile(before, after, name, q)
            for name in ("overhead", "loop_lag")
            for q in (50, 99)
        ],
        steal=steal_share(ticks, cpu_ticks()),
    )


def ttft_rows(setup: Cluster, args: argparse.Namespace) -> None:
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
    setup: Cluster, args: argparse.Namespace, header: str, row: Callable[[int, str], str]
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
    setup: Cluster, probe: ProbeEngine, policy: str, concurrency: int, args: argparse.Namespace
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
    if args.router_nice:  # else a prioritised router would delay the prober's direct probes
        renice(process.pid, args.router_nice)  # (allowed: the routers' renice was)
    cpu0, wait0, before = (
        cpu_seconds(proc.pid),
        runnable_wait_seconds(proc.pid),
        router_histograms(port),
    )
    ticks = cpu_ticks()
    load = run_async(
        run_loop(
            [port],
            concurrency,
            args.ttft_duration,
            True,
            args.max_tokens,
            args.prompt_tokens,
            args.ttft_warmup,
            args.shared_prefix_tokens,
            load_sessions,
        )
    )
    results = receiver.recv()
    process.join()
    after = router_histograms(port)
    return ProbeResult(
        load,
        *probe_transits(results, probe),
        cpu=(cpu_seconds(proc.pid) - cpu0) / load.wall,
        cpu_wait=(runnable_wait_seconds(proc.pid) - wait0) / load.wall,
        side=[
            bucket_quantile(before, after, name, q)
            for name in ("overhead", "loop_lag")
            for q in (50, 99)
        ],
        steal=steal_share(ticks, cpu_ticks()),
    )


def probe_rows(setup: Cluster, probe: ProbeEngine, args: argparse.Namespace, workdir: Path) -> None:
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


def throughput_rows(
    ports: list[int],
    router_port: int,
    router: subprocess.Popen[bytes],
    engines: subprocess.Popen[bytes],
    args: argparse.Namespace,
) -> None:
    concurrency = 64
    engine0 = cpu_seconds(engines.pid)
    direct, _, elapsed_d = run_async(closed_loop(ports, concurrency, args.duration, False, 4))
    engine_per_request = (cpu_seconds(engines.pid) - engine0) / max(len(direct), 1)
    before = router_histograms(router_port)
    cpu0 = cpu_seconds(router.pid)
    routed, _, elapsed_r = run_async(
        closed_loop([router_port], concurrency, args.duration, False, 4)
    )
    router_cpu = cpu_seconds(router.pid) - cpu0
    after = router_histograms(router_port)
    rps_d, rps_r = len(direct) / elapsed_d, len(routed) / elapsed_r
    per_request = router_cpu / max(len(routed), 1)
    print(f"\nThroughput, non-streamed max_tokens=4, {concurrency} in flight")
    print(
        f"{'direct req/s':>12} {'router req/s':>12} {'ratio':>6} {'engine CPU/req':>14} "
        f"{'router CPU/req':>14} {'router req/CPU-s':>16}"
    )
    print(
        f"{rps_d:>12.0f} {rps_r:>12.0f} {rps_r / rps_d:>6.2f} "
        f"{engine_per_request * 1e6:>12.0f}µs {per_request * 1e6:>12.0f}µs "
        f"{1 / per_request:>16.0f}"
    )
    count = after["decision"].count - before["decision"].count
    print(
        "\nRouter hot path per request (its own histograms, wall clock): median bucket, "
        "mean, and the mean's share of the router's CPU time per request"
    )
    for name, label in (
        ("tokenize", "tokenize"),
        ("hashing", "hash blocks"),
        ("decision", "policy decision"),
    ):
        mean = (after[name].sum - before[name].sum) / max(count, 1)
        median = f"≤ {bucket_quantile(before, after, name) * 1e6:.0f} µs"
        print(
            f"{label:>16}: median {median:>9}, mean "
            f"{mean * 1e6:6.1f} µs ({mean / per_request:6.1%})"
        )
    print(
        f"\n# load average at the end: {os.getloadavg()[0]:.1f} (other work on the machine "
        "competes for the same CPUs)"
    )


if __name__ == "__main__":
    main()


if __name__ == "__main__":
    main()
