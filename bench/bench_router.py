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
import os
import platform
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.lib.cpu import PLACEMENTS, placed, prioritised
from bench.lib.prober import probe_engine
from bench.lib.processes import INSTANCES, bench_stack
from bench.lib.router_cost import cpu_rows, hot_path_rows, throughput_rows
from bench.lib.router_latency import probe_rows, ttft_rows


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
            with bench_stack(args.ttft_time_scale, Path(tmp)) as slow:
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
                bench_stack(args.ttft_time_scale, Path(tmp), probe.url) as slow,
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
            with bench_stack(args.time_scale, Path(tmp)) as fast:
                if "throughput" in sections:
                    throughput_rows(fast, args)
                if "cpu" in sections:
                    cpu_rows(fast, args)
    if "hot-path" in sections:
        hot_path_rows()


if __name__ == "__main__":
    main()
