"""What a router adds to a request, Switchyard beside vllm-router, each alone in front of
the same enginesim fleet; writes bench/router_sidebyside.md.

Fleet: ``python -m enginesim serve`` with 2 instances (H20, Qwen2-7B, ``--time-scale
0.02``). Contenders: Switchyard (round_robin, lmetric) and vllm-router (round_robin,
cache_aware; the ``bench`` extra installs it), each started alone, in shuffled order,
``--rounds`` times; with ``--before PATH`` also the Switchyard router of another checkout
(``git worktree add PATH <commit>``), measured in the same run for a before/after table.
Each row: ``streams`` closed-loop workers for ``--duration`` s, sending ``/v1/completions``
with ``max_tokens`` 2 and prompts of 2–``--max-words`` words, unique from their first word;
each request goes at random straight to an engine or through the router, non-streamed or
streamed (``bench.lib.router_sidebyside``). The Switchyard rows add the router's own
per-stage means (``switchyard_router_stage_seconds``).

    .venv/bin/python bench/bench_router_sidebyside.py [--rounds 2] [--before /tmp/before]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.lib.router_sidebyside import (
    Contender,
    engine_fleet,
    side_by_side_rows,
    stage_table,
    summarise,
)
from devharness import stop_process

REPORT = Path(__file__).resolve().parent / "router_sidebyside.md"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=6.0, help="seconds per row")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each contender")
    parser.add_argument("--concurrency", type=int, action="append", help="default 1 8 64 200")
    parser.add_argument("--max-words", type=int, default=200)
    parser.add_argument("--before", type=Path, help="also the Switchyard of this checkout")
    parser.add_argument("--only", choices=("switchyard", "vllm-router"), action="append")
    parser.add_argument("--report", type=Path, default=REPORT)
    args = parser.parse_args()
    concurrencies = args.concurrency or [1, 8, 64, 200]
    contenders = [
        Contender("switchyard round_robin", "switchyard", "round_robin"),
        Contender("switchyard lmetric", "switchyard", "lmetric"),
        Contender("vllm-router round_robin", "vllm-router", "round_robin"),
        Contender("vllm-router cache_aware", "vllm-router", "cache_aware"),
    ]
    if args.before is not None:
        contenders += [
            Contender("before: switchyard round_robin", "switchyard", "round_robin", args.before),
            Contender("before: switchyard lmetric", "switchyard", "lmetric", args.before),
        ]
    if args.only:
        contenders = [c for c in contenders if c.kind in args.only]
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        ports, fleet, log = engine_fleet(2, 0.02, Path(tmp))
        try:
            rows = side_by_side_rows(
                ports,
                log,
                contenders,
                concurrencies,
                args.duration,
                args.rounds,
                args.max_words,
                Path(tmp),
            )
        finally:
            stop_process(fleet)
    load_end = os.getloadavg()
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    lines = [
        "# Router overhead: Switchyard beside vllm-router",
        "",
        f"Made by `bench/bench_router_sidebyside.py` on {datetime.date.today()} ({machine}); "
        f"load average {load_start[0]:.1f} at start, {load_end[0]:.1f} at the end (the machine "
        "is shared: rows with a load well above 2 ran beside other work).",
        "",
        f"Fleet: enginesim, 2 instances, H20 / Qwen2-7B, time scale 0.02. Each router alone "
        f"in front of it, {args.rounds} run(s) each in shuffled order; per run and row "
        f"{args.duration:g} s of closed-loop workers (`streams`), `/v1/completions` with "
        f"`max_tokens` 2 and prompts of 2–{args.max_words} words unique from their first "
        "word; each request at random direct (one of the engines) or through the router, "
        "non-streamed or streamed.",
        "",
        "Added = routed − direct percentile, ms, median over the runs. `whole` (a "
        "non-streamed answer) and `first chunk` (a stream's first text event) are transits: "
        "the client's time minus the engine's own time for that request (from its "
        "`--request-log`, joined on `X-Request-Id`: handler start → last byte, or → first "
        "token), so the engines' queueing, which the policies change, drops out and what "
        "is left is the path: loopback hops, the client's, the router's and the engine's "
        "socket handling. `headers` (a stream's response head) is as the client saw it. "
        "`direct p50` = the direct path's own p50s (ms); failed = errors plus answers the "
        "engine's log does not have.",
        "",
        *summarise(rows),
        "",
        "## Switchyard's own time per stage",
        "",
        "Mean µs per request from `switchyard_router_stage_seconds` over each row (median "
        "over the runs): body = reading the request body; intake = parse, check, tokenize, "
        "hash; decide = the policy's decision and the plan; connect = the upstream "
        "connection (idle pool or new); send = writing the request; engine = to the "
        "engine's response head; first_event = to its first event (streams) or whole "
        "answer; relay = writing that to the client. engine and first_event are mostly the "
        "engine's own time.",
        "",
        *stage_table(rows),
        "",
    ]
    args.report.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
