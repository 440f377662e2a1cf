"""Instructions per routed request, counted by callgrind: a before/after comparison of the
router's request path that a loaded machine cannot blur.

CPU time per request (the side-by-side rows) moves by 15-30% between runs on a shared
2-core VM, more than most changes to the request path. An instruction count does not: what
a request executes depends on the code and its inputs, not on what else the machine runs.
Each contender
(Switchyard's round_robin and lmetric from this checkout and, with ``--before PATH``, from
another; the Python floor, ``bench.lib.python_floor``) runs alone under ``valgrind
--tool=callgrind`` in front of the same 2 enginesim instances (H20, Qwen2-7B), with health
checks and scrapes every 60 s, outside the window. ``--warmup`` requests warm it up; then
its counters are zeroed
(``callgrind_control``), ``--requests`` requests are sent one at a time (the same prompts in
the same order for every contender: ``/v1/completions``, ``max_tokens`` 2, every other one
streamed, 2-``--max-words`` words unique from their first), and the counters are dumped.
A second window of the same length with no request measures what the idle process
executes: the loops that tick with wall time (uvicorn's, the loop-lag sampler, telemetry,
peer sync), which valgrind's slowdown and the machine's load stretch. The figure per request
is the busy window less the idle one, divided by the requests.

Rows: net instructions per request (millions) for each run, as a multiple of the floor's,
and the idle window's share of the busy one.

    .venv/bin/python -m bench.router_overhead.instructions [--before PATH] [--requests 300]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.lib.loadclient import MODEL
from bench.lib.processes import REPO, engine_ports, start_engines
from devharness import ManagedProcess, free_port, wait_until
from devharness.routers import router_env

QUIET = {"scrape_interval_s": 60, "health_interval_s": 60, "max_concurrency": 4096}
TOTALS = re.compile(r"^(?:totals|summary):\s*(\d+)", re.MULTILINE)


@dataclass(frozen=True)
class Contender:
    label: str
    kind: str  # switchyard | python-floor
    policy: str = "round_robin"
    tree: Path = REPO


def _argv(who: Contender, port: int, engines: list[int], workdir: Path) -> list[str]:
    if who.kind == "python-floor":
        return [sys.executable, "-m", "bench.lib.python_floor", str(port), *map(str, engines)]
    config = {
        "model": MODEL,
        "policy": {"kind": who.policy, "params": {}},
        "instances": [
            {"name": f"i{k}", "url": f"http://127.0.0.1:{p}"} for k, p in enumerate(engines)
        ],
        "router": QUIET,
    }
    path = workdir / f"router-{port}.json"
    path.write_text(json.dumps(config))
    return [sys.executable, "-m", "router_worker", "--port", str(port), "--config", str(path),
            "--redis-url", "none", "--log-level", "WARNING"]  # fmt: skip


@contextlib.contextmanager
def under_callgrind(
    who: Contender, engines: list[int], workdir: Path
) -> Iterator[tuple[int, int, Path]]:
    """The contender started under callgrind: its port, pid, and the prefix of its dump
    files."""
    port = free_port()
    out = workdir / f"callgrind-{port}"
    valgrind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
    managed = ManagedProcess(
        [*valgrind, *_argv(who, port, engines, workdir)],
        cwd=who.tree,
        env={**router_env(), "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(who.tree)},
        log=workdir / f"contender-{port}.log",
    ).start()
    with managed:

        def healthy() -> bool:
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
            return False

        wait_until(healthy, 600, who.label, managed.running)
        yield port, managed.pid, out


def prompts(count: int, max_words: int, seed: int) -> list[tuple[str, bool]]:
    """The same requests for every contender: (prompt, streamed)."""
    rng = random.Random(seed)
    words = [f"w{k}" for k in range(997)]
    return [
        (" ".join([f"r{n}", *rng.choices(words, k=rng.randint(1, max_words - 1))]), n % 2 == 1)
        for n in range(count)
    ]


def send(port: int, requests: list[tuple[str, bool]]) -> float:
    """Send ``requests`` one at a time; return the seconds it took."""
    start = time.monotonic()
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
        for prompt, stream in requests:
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 2, "stream": stream}
            with client.stream("POST", "/v1/completions", json=body) as response:
                response.read()
                if response.status_code != 200:
                    raise RuntimeError(f"{response.status_code}: {response.text[:200]}")
    return time.monotonic() - start


def window(pid: int, out: Path, dumps: int) -> int:
    """Dump (and zero) the counters: the instructions since the last zero or dump, read
    from the dump file numbered ``dumps``."""
    subprocess.run(["callgrind_control", "--dump", str(pid)], check=True, capture_output=True)
    path = out.with_name(f"{out.name}.{dumps}")
    wait_until(lambda: path.exists() and TOTALS.search(path.read_text()) is not None, 60, "dump")
    found = TOTALS.search(path.read_text())
    assert found is not None
    return int(found.group(1))


def measure(
    who: Contender, engines: list[int], workdir: Path, args: argparse.Namespace
) -> tuple[float, float]:
    """(instructions in the busy window, in an idle window as long), each per request."""
    work = prompts(args.warmup + args.requests, args.max_words, args.seed)
    with under_callgrind(who, engines, workdir) as (port, pid, out):
        send(port, work[: args.warmup])
        subprocess.run(["callgrind_control", "--zero", str(pid)], check=True, capture_output=True)
        took = send(port, work[args.warmup :])
        busy = window(pid, out, 1)
        time.sleep(took)  # as long again, no request: what the idle process runs
        idle = window(pid, out, 2)
    return busy / args.requests, idle / args.requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path, help="also this checkout's Switchyard")
    parser.add_argument("--requests", type=int, default=300, help="requests counted")
    parser.add_argument("--warmup", type=int, default=60, help="requests before counting")
    parser.add_argument("--max-words", type=int, default=200, help="longest prompt")
    parser.add_argument("--seed", type=int, default=1, help="the prompts' seed")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each contender")
    args = parser.parse_args()
    contenders = [
        Contender("python floor", "python-floor"),
        Contender("switchyard round_robin", "switchyard", "round_robin"),
        Contender("switchyard lmetric", "switchyard", "lmetric"),
    ]
    if args.before is not None:
        contenders += [
            Contender("before: switchyard round_robin", "switchyard", "round_robin", args.before),
            Contender("before: switchyard lmetric", "switchyard", "lmetric", args.before),
        ]
    results: dict[str, list[tuple[float, float]]] = {c.label: [] for c in contenders}
    with tempfile.TemporaryDirectory() as tmp, start_engines(2, 0.02, Path(tmp)) as (fleet, _):
        for _ in range(args.repeat):
            for who in contenders:
                results[who.label].append(measure(who, engine_ports(fleet), Path(tmp), args))
                print(
                    f"  measured {who.label}: {results[who.label][-1][0] / 1e6:.3f} M", flush=True
                )
    print(table(results, args))


def table(results: dict[str, list[tuple[float, float]]], args: argparse.Namespace) -> str:
    def net(runs: list[tuple[float, float]]) -> list[float]:
        return [busy - idle for busy, idle in runs]

    floor = min(net(results["python floor"]))
    lines = [
        f"# net instructions per routed request (callgrind; {args.requests} requests after "
        f"{args.warmup} of warm-up, one at a time, max_tokens 2, half streamed; busy window "
        "less an idle window as long)",
        "",
        "| contender | M instructions / request (each run) | × floor | idle ÷ busy window |",
        "|---|---|---:|---:|",
    ]
    for label, runs in results.items():
        each = ", ".join(f"{value / 1e6:.3f}" for value in net(runs))
        idle = ", ".join(f"{i / b:.0%}" for b, i in runs)
        lines.append(f"| {label} | {each} | {min(net(runs)) / floor:.2f} | {idle} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
