"""What the router adds to a request and what it costs: Switchyard beside vllm-router, each
alone in front of the same fleet, and the router's own CPU and throughput.

Side-by-side rows (``--only side-by-side``; they write ``bench/router_overhead/sidebyside.md``).
Fleet: ``python -m enginesim serve`` with 2 instances (H20, Qwen2-7B, time scale 0.02).
Contenders: Switchyard (round_robin, lmetric) and vllm-router (round_robin, cache_aware;
``pip install -e '.[bench]'`` installs it), each started alone, in shuffled order,
``--rounds`` times; with ``--before PATH`` also the Switchyard of another checkout (``git
worktree add PATH <commit>``), measured in the same run for a before/after table. Per run
and row (``--concurrency``: 1, 8, 64, 200 by default), closed-loop workers send
``/v1/completions`` with ``max_tokens`` 2 and prompts of 2–``--max-words`` words, unique
from their first word; each request goes at random straight to an engine or through the
router, non-streamed or streamed, so both paths share the engines, the client and the
moment. What a request spends on its path (its *transit*) is its client time minus the
engine's own time for it (enginesim's ``--request-log``, joined on ``X-Request-Id``): the
engines' queueing, which policies change, drops out. Added = routed − direct transit per
percentile. The Switchyard rows add the router's own per-stage means
(``switchyard_router_stage_seconds``: body, intake, decide, connect, send, engine,
first_event, relay) and its CPU per routed request. ``bench.lib.router_sidebyside`` has the
client and the tables.

Throughput: closed-loop non-streamed requests (``max_tokens`` 4) at 64 in flight, engines
at 20× speed (``--time-scale 0.05``). Time shares: the router's own histograms (tokenize,
hash, decide) against the router process's CPU time per request. CPU cost (the figure that
stays comparable on a shared machine): process CPU time (``/proc/<pid>/stat``) of the
router and of enginesim serving the same load directly, per non-streamed request, per
stream (intercept) and per SSE chunk (slope between 4- and 64-token streams), at 32 in
flight.

Capture: what a traffic capture costs per request, in-process: the append on the request
path, and the keyed digests and JSON in the telemetry writer, off it.

    .venv/bin/python -m bench.router_overhead.run [--only side-by-side] [--rounds 3] [--before PATH]
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
from pathlib import Path

from bench.lib.processes import INSTANCES, bench_stack
from bench.lib.router_cost import capture_rows, cpu_rows, hot_path_rows, throughput_rows
from bench.lib.router_sidebyside import REPORT, side_by_side

SECTIONS = ("side-by-side", "throughput", "cpu", "hot-path", "capture")


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
        "--row-duration", type=float, default=5.0, help="seconds per side-by-side row and run"
    )
    parser.add_argument("--rounds", type=int, default=3, help="side-by-side runs of each router")
    parser.add_argument(
        "--concurrency",
        type=int,
        action="append",
        help="side-by-side concurrent streams (repeatable; default 1, 8, 64, 200)",
    )
    parser.add_argument("--max-words", type=int, default=200, help="longest side-by-side prompt")
    parser.add_argument("--before", type=Path, help="side-by-side: also this checkout's router")
    parser.add_argument(
        "--router",
        choices=("switchyard", "vllm-router"),
        action="append",
        help="side-by-side: only these routers (repeatable)",
    )
    parser.add_argument("--report", type=Path, default=REPORT, help="side-by-side report file")
    parser.add_argument(
        "--only", choices=SECTIONS, action="append", help="run only these sections (repeatable)"
    )
    args = parser.parse_args()
    sections = set(args.only or SECTIONS)
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    print(f"# router overhead ({machine}); load average at start: {os.getloadavg()[0]:.1f}")
    if "side-by-side" in sections:
        side_by_side(args)
    if sections & {"throughput", "cpu"}:
        print(
            f"\n# {INSTANCES} enginesim instances h20/qwen2-7b; routers lmetric and "
            "round_robin, approx tokenizer"
        )
        with tempfile.TemporaryDirectory() as tmp, bench_stack(args.time_scale, Path(tmp)) as fast:
            if "throughput" in sections:
                throughput_rows(fast, args)
            if "cpu" in sections:
                cpu_rows(fast, args)
    if "hot-path" in sections:
        hot_path_rows()
    if "capture" in sections:
        capture_rows()


if __name__ == "__main__":
    main()
