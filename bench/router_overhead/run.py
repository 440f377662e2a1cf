"""What the router adds to a request and what it costs: Switchyard beside vllm-router, each
alone in front of the same fleet, and the router's own CPU and throughput.

Side-by-side rows (``--only side-by-side``; they write ``bench/router_overhead/sidebyside.md``,
with ``--router-nice N`` every router process at niceness N into ``sidebyside-nice.md``).
Fleet: a devharness.Fleet of 2 enginesim instances (H20, Qwen2-7B, time scale 0.02).
Contenders: Switchyard (round_robin, lmetric), vllm-router (round_robin, cache_aware;
``pip install -e '.[bench]'`` installs it) and the Python floor (``bench.lib.python_floor``:
the router's HTTP stack forwarding round robin with none of its per-request work), each
started alone, in shuffled order,
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
first_event, relay) and its CPU per routed request. The report ends by holding each
Switchyard row against the router overhead goals (added p50 and p99 at 1 stream, p50 at 200,
no more than each vllm-router policy), beside what it adds over the Python floor of the same
run and its CPU as a multiple of the floor's. ``bench.lib.router_sidebyside`` has the client
and the tables.

Throughput: closed-loop non-streamed requests (``max_tokens`` 4) at 64 in flight, engines
at 20× speed (``--time-scale 0.05``). Time shares: the router's own histograms (tokenize,
hash, decide) against the router process's CPU time per request. CPU cost (the figure that
stays comparable on a shared machine): process CPU time (``/proc/<pid>/stat``) of the
router and of enginesim serving the same load directly, per non-streamed request, per
stream (intercept) and per SSE chunk (slope between 4- and 64-token streams), at 32 in
flight.

CPU split (``bench.lib.router_cpu_split``): the Python floor and Switchyard (round_robin,
lmetric), each alone under the side-by-side load at 8 streams, their CPU per routed request
split by ``perf record`` into the Python interpreter, numpy, the kernel and the rest (event
loop, HTTP parser, libc).

Cold path (``bench.lib.router_cold_path``): the hot path in-process for round_robin and
lmetric over 2 and 16 instances, warm and with the CPU caches evicted before each request
(as a host's other processes evict them between a router's requests), and one numpy call
and one Python loop timed the same way.

Capture: what a traffic capture costs per request, in-process: the append on the request
path, and the keyed digests and JSON in the telemetry writer, off it.

Upstream pool: requests per second one client gets from a trivial uvicorn app, one request
at a time, while it holds N − 1 other connections open (the streams a router relays), with
httpx's default transport and with the router's ``FastTransport``.

A whole run writes ``README.md`` beside this script: the machine, then every section's
table as printed (side-by-side rows link to their own report).

    .venv/bin/python -m bench.router_overhead.run [--only side-by-side] [--rounds 3] [--before PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import os
import platform
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from bench.lib.processes import INSTANCES, bench_stack
from bench.lib.router_cold_path import cold_path_rows
from bench.lib.router_cost import (
    capture_rows,
    cpu_rows,
    hot_path_rows,
    throughput_rows,
    upstream_pool_rows,
)
from bench.lib.router_cpu_split import cpu_split_rows
from bench.lib.router_sidebyside import side_by_side

SECTIONS = (
    "side-by-side",
    "throughput",
    "cpu",
    "cpu-split",
    "hot-path",
    "cold-path",
    "capture",
    "upstream-pool",
)
README = Path(__file__).resolve().parent / "README.md"


class _Tee(io.StringIO):
    """Keeps what a section prints and passes it on to the terminal as it comes."""

    def write(self, text: str) -> int:
        if sys.__stdout__ is not None:
            sys.__stdout__.write(text)
        return super().write(text)


def readme(machine: str, loads: tuple[float, float], printed: dict[str, str]) -> str:
    """README.md of a whole run: every section's table as the run printed it."""
    lines = [
        "# Router overhead",
        "",
        f"Generated by `python -m bench.router_overhead.run` on {datetime.date.today()} "
        f"({machine}); load average {loads[0]:.1f} at the start, {loads[1]:.1f} at the end. "
        "CPU figures are per process (`/proc/<pid>/stat`), the ones that stay comparable on "
        "a shared machine; see the script's docstring for what each section runs. What "
        "Switchyard and vllm-router each add to a request is in "
        "[sidebyside.md](sidebyside.md) (`--only side-by-side`), and with each router "
        "given priority on the shared machine in [sidebyside-nice.md](sidebyside-nice.md) "
        "(`--router-nice -10`).",
        "",
    ]
    for section, text in printed.items():
        lines += [f"## {section}", "", "```", text.strip("\n"), "```", ""]
    return "\n".join(lines)


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
        choices=("switchyard", "vllm-router", "python-floor"),
        action="append",
        help="side-by-side: only these routers (repeatable)",
    )
    parser.add_argument(
        "--router-nice",
        type=int,
        default=0,
        help="side-by-side: run every router process at this niceness (router_worker/README: "
        "give routers priority on a shared host; negative values need CAP_SYS_NICE)",
    )
    parser.add_argument(
        "--report",
        type=Path,
        help="side-by-side report file (default sidebyside.md, with --router-nice "
        "sidebyside-nice.md)",
    )
    parser.add_argument(
        "--only", choices=SECTIONS, action="append", help="run only these sections (repeatable)"
    )
    args = parser.parse_args()
    sections = set(args.only or SECTIONS)
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    load_start = os.getloadavg()[0]
    print(f"# router overhead ({machine}); load average at start: {load_start:.1f}")
    if "side-by-side" in sections:
        side_by_side(args)
    printed: dict[str, str] = {}

    def section(name: str, rows: Callable[[], None]) -> None:
        if name in sections:
            with contextlib.redirect_stdout(_Tee()) as out:
                rows()
            printed[name] = out.getvalue()

    if sections & {"throughput", "cpu"}:
        print(
            f"\n# {INSTANCES} enginesim instances h20/qwen2-7b; routers lmetric and "
            "round_robin, approx tokenizer"
        )
        with tempfile.TemporaryDirectory() as tmp, bench_stack(args.time_scale, Path(tmp)) as fast:
            section("throughput", lambda: throughput_rows(fast, args))
            section("cpu", lambda: cpu_rows(fast, args))
    section("cpu-split", lambda: cpu_split_rows(args))
    section("hot-path", hot_path_rows)
    section("cold-path", cold_path_rows)
    section("capture", capture_rows)
    section("upstream-pool", lambda: upstream_pool_rows(args.duration))
    if set(printed) == set(SECTIONS) - {"side-by-side"}:  # a whole run of them
        README.write_text(readme(machine, (load_start, os.getloadavg()[0]), printed))
        print(f"wrote {README}")


if __name__ == "__main__":
    main()
