"""The side-by-side rows of the router overhead study (bench/router_overhead): what
Switchyard and vllm-router each add to a request, every router running alone in front of
the same enginesim fleet; they write ``bench/router_overhead/sidebyside.md`` whole.

Each row is a closed loop of ``streams`` workers. Every request picks, at random and
independently, its path (straight to one of the engines, or through the router under test)
and its kind (non-streamed, or streamed), so both paths see the same engines, client and
moment; prompts are 2–200 words and unique from their first word, so no path profits from a
prefix the other cached. A request's transit is its client time minus the engine's own time
for it (the engine's request log), and added = routed − direct transit per percentile, for
the whole answer (non-streamed) and the first text chunk (streamed); a stream's response
head is compared as the client saw it."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httptools
import httpx

from bench.lib.cpu import cpu_seconds
from bench.lib.loadclient import MODEL, run_async
from bench.lib.processes import (
    REPO,
    ROUTER_ADMIN_TOKEN,
    EngineLog,
    engine_ports,
    start_bench_router,
    start_engines,
)
from devharness import ManagedProcess, free_port, wait_http
from engine_interface import percentile, read_histogram, read_samples
from router_worker.priority import set_niceness
from router_worker.stages import STAGES

VLLM_ROUTER_VERSION = "0.1.17"


def is_200(status: int) -> bool:
    return status == 200


REPORT = Path(__file__).resolve().parents[1] / "router_overhead" / "sidebyside.md"
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india"]
# metric: (non-streamed whole answer, streamed headers, streamed first text chunk)
METRICS = ("whole", "headers", "first")


@dataclass
class Samples:
    """Latencies (s) of one row by path (direct | routed) and metric."""

    values: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    failures: int = 0
    unmatched: int = 0  # answered, but the engine's log has no record of it

    def add(self, path: str, metric: str, value: float) -> None:
        self.values.setdefault((path, metric), []).append(value)

    def get(self, path: str, metric: str) -> list[float]:
        return self.values.get((path, metric), [])

    def added(self, metric: str, q: float) -> float:
        """Routed − direct percentile ``q``, ms (nan without samples)."""
        routed, direct = (
            percentile(self.get("routed", metric), q),
            percentile(self.get("direct", metric), q),
        )
        if routed is None or direct is None:
            return float("nan")
        return (routed - direct) * 1000


class _Exchange:
    """httptools callbacks of one response: when its head and its first text arrived."""

    def __init__(self) -> None:
        self.head: float | None = None
        self.first: float | None = None
        self.complete = False
        self.done = 0.0
        self.keep_alive = False
        self.parser = httptools.HttpResponseParser(self)

    def on_headers_complete(self) -> None:
        self.head = time.monotonic()
        self.keep_alive = self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        if self.first is None and b'"text":"' in body:
            self.first = time.monotonic()

    def on_message_complete(self) -> None:
        self.complete = True
        self.done = time.monotonic()


class _Connections:
    """One keep-alive connection per port, opened on first use (not timed)."""

    def __init__(self) -> None:
        self.open: dict[int, tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}

    async def exchange(self, port: int, request: bytes) -> tuple[float, _Exchange] | None:
        if port not in self.open or self.open[port][0].at_eof():
            self.open[port] = await asyncio.open_connection("127.0.0.1", port)
        reader, writer = self.open[port]
        answer = _Exchange()
        sent = time.monotonic()
        writer.write(request)
        try:
            while not answer.complete:
                data = await reader.read(65536)
                if not data:
                    raise ConnectionError("closed")
                answer.parser.feed_data(data)
        except (ConnectionError, httptools.HttpParserError):
            writer.close()
            del self.open[port]
            return None
        if not answer.keep_alive:
            writer.close()
            del self.open[port]
        if answer.parser.get_status_code() != 200:
            return None
        return sent, answer

    def close(self) -> None:
        for _, writer in self.open.values():
            writer.close()


def _request(prompt: str, stream: bool, max_tokens: int, request_id: str) -> bytes:
    body = json.dumps(
        {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": stream}
    ).encode()
    return (
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nX-Request-Id: %s\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (request_id.encode(), len(body), body)
    )


@dataclass(slots=True)
class Outcome:
    """One answered request, client side (monotonic s, the engines' log clock)."""

    request_id: str
    routed: bool
    stream: bool
    sent: float
    head: float
    first: float | None
    done: float


async def interleaved(
    router: int, engines: list[int], streams: int, duration: float, max_words: int, seed: int
) -> tuple[list[Outcome], int]:
    """``streams`` workers for ``duration`` s; each request's path and kind at random.
    Returns the answered requests and the number that failed."""
    outcomes: list[Outcome] = []
    failures = 0
    deadline = time.monotonic() + duration
    nonce = time.monotonic_ns()

    async def worker(n: int) -> None:
        nonlocal failures
        rng = random.Random(seed * 1000 + n)
        conns = _Connections()
        k = 0
        while time.monotonic() < deadline:
            routed = rng.random() < 0.5
            stream = rng.random() < 0.5
            words = rng.randint(2, max_words)
            # Unique from the first word: no prefix shared with any other request.
            request_id = f"u{nonce}x{seed}x{n}x{k}"
            prompt = " ".join([request_id, *(rng.choice(WORDS) for _ in range(words - 1))])
            port = router if routed else rng.choice(engines)
            got = await conns.exchange(port, _request(prompt, stream, 2, request_id))
            k += 1
            if got is None:
                failures += 1
                continue
            sent, answer = got
            assert answer.head is not None
            outcomes.append(
                Outcome(request_id, routed, stream, sent, answer.head, answer.first, answer.done)
            )
        conns.close()

    await asyncio.gather(*(worker(n) for n in range(streams)))
    return outcomes, failures


def transits(outcomes: list[Outcome], failures: int, log: EngineLog) -> Samples:
    """Per request: client time minus the engine's own time for it (handler start → first
    token for a stream's first chunk, → last byte for a whole answer), so the engines'
    queueing and prefill, which the router's policy changes, drop out; the response head
    is left as the client saw it."""
    engine = log.of({o.request_id for o in outcomes})
    samples = Samples(failures=failures)
    for o in outcomes:
        path = "routed" if o.routed else "direct"
        record = engine.get(o.request_id)
        if o.stream:
            samples.add(path, "headers", o.head - o.sent)
        if record is None:
            samples.unmatched += 1
            continue
        arrival = record["arrival"]
        if o.stream and o.first is not None and record.get("first_token"):
            samples.add(path, "first", o.first - o.sent - (record["first_token"] - arrival))
        elif not o.stream and record.get("finished"):
            samples.add(path, "whole", o.done - o.sent - (record["finished"] - arrival))
    return samples


# ----- the routers under test ----------------------------------------------------------------
def vllm_router_binary() -> str | None:
    """The ``vllm-router`` launcher of this venv (the ``bench`` extra), or None."""
    found = Path(sys.executable).with_name("vllm-router")
    if found.exists():
        return str(found)
    return shutil.which("vllm-router")


@contextlib.contextmanager
def router_alone(
    kind: str, policy: str, engines: list[int], workdir: Path, tree: Path | None = None
) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """Start one router over ``engines``: ``switchyard`` (from the checkout ``tree``, this
    one by default) or ``vllm-router``; yield its port and process."""
    if kind == "switchyard":
        urls = [f"http://127.0.0.1:{p}" for p in engines]
        router = start_bench_router(urls, policy, workdir, tree or REPO)
        port, managed = router.port, router.managed
    elif kind == "python-floor":
        port, managed = _start_python_floor(engines)
    else:
        port, managed = _start_vllm_router(policy, engines, workdir)
    with managed:
        yield port, managed.running


def _start_python_floor(engines: list[int]) -> tuple[int, ManagedProcess]:
    port = free_port()
    argv = [sys.executable, "-m", "bench.lib.python_floor", str(port), *map(str, engines)]
    return port, _healthy(ManagedProcess(argv, cwd=REPO, stdin=None, stderr=None), port, 30.0)


def _start_vllm_router(
    policy: str, engines: list[int], workdir: Path
) -> tuple[int, ManagedProcess]:
    binary = vllm_router_binary()
    if binary is None:
        raise SystemExit(
            "vllm-router is not installed: .venv/bin/pip install -e '.[bench]' "
            f"(or .venv/bin/pip install vllm-router=={VLLM_ROUTER_VERSION})"
        )
    port = free_port()
    managed = ManagedProcess(
        [
            binary,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--worker-urls",
            *(f"http://127.0.0.1:{p}" for p in engines),
            "--policy",
            policy,
            "--prometheus-port",
            str(free_port()),
            "--log-level",
            "warning",
            "--log-dir",
            str(workdir / f"vllm-router-{port}"),
        ],
        stdin=None,
        stderr=None,
    )
    return port, _healthy(managed, port, 60.0)


def _healthy(managed: ManagedProcess, port: int, timeout: float) -> ManagedProcess:
    """Start ``managed`` and wait for its ``/health`` on ``port`` (stopped if it never
    answers 200)."""
    managed.start()
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout, process=managed.running, ok=is_200)
    except BaseException:
        managed.stop()
        raise
    return managed


def stage_means(port: int) -> dict[str, tuple[float, float]]:
    """The Switchyard router's ``switchyard_router_stage_seconds``: stage → (sum s, count)."""
    name = "switchyard_router_stage_seconds"
    try:
        text = httpx.get(
            f"http://127.0.0.1:{port}/metrics",
            headers={"Authorization": f"Bearer {ROUTER_ADMIN_TOKEN}"},
        ).text
    except httpx.HTTPError:
        return {}
    found, _ = read_samples(text, [name])
    out = {}
    for stage in STAGES:
        histogram = read_histogram(found, name, stage=stage)
        if histogram is not None:
            out[stage] = (histogram.sum, histogram.count)
    return out


@dataclass
class Row:
    router: str
    streams: int
    samples: Samples
    load: float
    stages: dict[str, float]  # stage → mean µs over the row (Switchyard only)
    cpu_us: float  # the router process's CPU time per routed request, µs


@dataclass(frozen=True)
class Contender:
    """A router under test: its label in the tables, kind, policy and (Switchyard) checkout."""

    label: str
    kind: str  # switchyard | vllm-router | python-floor (bench.lib.python_floor)
    policy: str
    tree: Path | None = None


def side_by_side_rows(
    engines: list[int],
    log: EngineLog,
    contenders: list[Contender],
    concurrencies: list[int],
    duration: float,
    rounds: int,
    max_words: int,
    workdir: Path,
    niceness: int = 0,
) -> list[Row]:
    """Every contender alone, ``rounds`` times in shuffled order, its process (all threads)
    at ``niceness``; each run covers every concurrency. Returns one Row per run and
    concurrency."""
    rows: list[Row] = []
    order = [c for _ in range(rounds) for c in contenders]
    random.Random(7).shuffle(order)
    for run, who in enumerate(order):
        with router_alone(who.kind, who.policy, engines, workdir, who.tree) as (port, proc):
            if niceness and not set_niceness(proc.pid, niceness):
                raise SystemExit(f"--router-nice {niceness}: not permitted (needs CAP_SYS_NICE)")
            for streams in concurrencies:
                # Not measured: fills both paths' connection pools at this concurrency.
                run_async(interleaved(port, engines, streams, 1.0, max_words, seed=-1 - run))
                before = stage_means(port) if who.kind == "switchyard" else {}
                load = os.getloadavg()[0]
                cpu = cpu_seconds(proc.pid)
                outcomes, failures = run_async(
                    interleaved(port, engines, streams, duration, max_words, seed=run)
                )
                routed = sum(o.routed for o in outcomes) or 1
                cpu_us = (cpu_seconds(proc.pid) - cpu) / routed * 1e6
                samples = transits(outcomes, failures, log)
                after = stage_means(port) if who.kind == "switchyard" else {}
                stages = {
                    s: (after[s][0] - before[s][0]) / (after[s][1] - before[s][1]) * 1e6
                    for s in after
                    if s in before and after[s][1] > before[s][1]
                }
                rows.append(Row(who.label, streams, samples, load, stages, cpu_us))
                print(
                    f"  {who.label} streams {streams}: added p50 whole "
                    f"{samples.added('whole', 50):+.2f} first chunk "
                    f"{samples.added('first', 50):+.2f} ms (load {load:.1f})",
                    file=sys.stderr,
                    flush=True,
                )
    return rows


def median_added(runs: list[Row], metric: str, q: float) -> float:
    """The median over ``runs`` of each run's added percentile ``q`` (ms)."""
    return statistics.median(r.samples.added(metric, q) for r in runs)


def summarise(rows: list[Row]) -> list[str]:
    """Markdown table: per router and concurrency, medians over runs of the added p50/p99."""
    lines = [
        "| router | streams | runs | n routed/direct | failed | direct p50 whole / headers / first "
        "| added p50 whole | p99 | added p50 headers | p99 | added p50 first chunk | p99 "
        "| CPU µs/req | load |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    keys = sorted({(r.router, r.streams) for r in rows}, key=lambda k: (k[1], k[0]))
    for router, streams in keys:
        runs = [r for r in rows if r.router == router and r.streams == streams]

        def med(metric: str, q: float, runs: list[Row] = runs) -> str:
            return f"{median_added(runs, metric, q):+.2f}"

        def direct(metric: str, runs: list[Row] = runs) -> str:
            values = [percentile(r.samples.get("direct", metric), 50) or 0.0 for r in runs]
            return f"{statistics.median(values) * 1000:.2f}"

        n_routed = sum(len(r.samples.get("routed", m)) for r in runs for m in ("whole", "first"))
        n_direct = sum(len(r.samples.get("direct", m)) for r in runs for m in ("whole", "first"))
        lines.append(
            f"| {router} | {streams} | {len(runs)} | {n_routed}/{n_direct} | "
            f"{sum(r.samples.failures + r.samples.unmatched for r in runs)} | "
            f"{direct('whole')} / {direct('headers')} / {direct('first')} | "
            f"{med('whole', 50)} | {med('whole', 99)} | {med('headers', 50)} | "
            f"{med('headers', 99)} | {med('first', 50)} | {med('first', 99)} | "
            f"{statistics.median(r.cpu_us for r in runs):.0f} | "
            f"{statistics.median(r.load for r in runs):.1f} |"
        )
    return lines


# The router overhead issue's goals for what Switchyard adds (ms, added p50 or p99 of the
# whole answer and of a stream's first chunk, whichever is worse): streams → (q, limit).
ABSOLUTE_GOALS: dict[int, list[tuple[int, float]]] = {1: [(50, 0.5), (99, 2.0)], 200: [(50, 1.0)]}
FLOOR = "python floor round_robin"
VLLM_ROUTERS = ("vllm-router round_robin", "vllm-router cache_aware")


def goal_table(rows: list[Row]) -> list[str]:
    """Markdown table: each Switchyard row of this run held against the goals, on the same
    medians as the main table (the worse of `whole` and `first chunk`), beside what it adds
    over the Python floor and its CPU per request as a multiple of the floor's."""
    by_key: dict[tuple[str, int], list[Row]] = {}
    for row in rows:
        by_key.setdefault((row.router, row.streams), []).append(row)

    def worst(router: str, streams: int, q: float) -> float | None:
        runs = by_key.get((router, streams))
        if not runs:
            return None
        return max(median_added(runs, metric, q) for metric in ("whole", "first"))

    lines = [
        "| router | streams | added p50 | goal | vs "
        + " | vs ".join(VLLM_ROUTERS)
        + " | p50 over the floor | CPU ÷ floor |",
        "|---|---:|---:|---|---|---|---:|---:|",
    ]
    for router, streams in sorted(by_key, key=lambda k: (k[1], k[0])):
        if "switchyard" not in router:
            continue
        p50 = worst(router, streams, 50)
        assert p50 is not None
        goals = [
            _verdict(worst(router, streams, q), limit, f"p{q}")
            for q, limit in ABSOLUTE_GOALS.get(streams, [])
        ]
        versus = [_verdict(p50, worst(other, streams, 50), "p50") for other in VLLM_ROUTERS]
        floor = worst(FLOOR, streams, 50)
        floor_cpu = [r.cpu_us for r in by_key.get((FLOOR, streams), [])]
        cpu = statistics.median(r.cpu_us for r in by_key[(router, streams)])
        lines.append(
            f"| {router} | {streams} | {p50:+.2f} | {'; '.join(goals) or '–'} | "
            + " | ".join(versus)
            + f" | {'–' if floor is None else f'{p50 - floor:+.2f}'} | "
            + (f"{cpu / statistics.median(floor_cpu):.1f}×" if floor_cpu else "–")
            + " |"
        )
    return lines


def _verdict(value: float | None, limit: float | None, name: str) -> str:
    """`met` or `missed` with the figures, or `–` when either side was not run."""
    if value is None or limit is None:
        return "–"
    return f"{'met' if value <= limit else 'missed'}: {name} {value:+.2f} vs {limit:+.2f}"


def stage_table(rows: list[Row]) -> list[str]:
    """Markdown table of the Switchyard routers' per-stage mean times (µs)."""
    lines = [
        "| router | streams | " + " | ".join(STAGES) + " |",
        "|---|---:|" + "---:|" * len(STAGES),
    ]
    keys = sorted({(r.router, r.streams) for r in rows if r.stages}, key=lambda k: (k[1], k[0]))
    for router, streams in keys:
        runs = [r for r in rows if r.router == router and r.streams == streams and r.stages]
        cells = []
        for stage in STAGES:
            values = [r.stages[stage] for r in runs if stage in r.stages]
            cells.append(f"{statistics.median(values):.0f}" if values else "–")
        lines.append(f"| {router} | {streams} | " + " | ".join(cells) + " |")
    return lines


def side_by_side(args: argparse.Namespace) -> None:
    """Run the rows for the router overhead study's options; write the report (``args.report``)."""
    contenders = [
        Contender("switchyard round_robin", "switchyard", "round_robin"),
        Contender("switchyard lmetric", "switchyard", "lmetric"),
        Contender("vllm-router round_robin", "vllm-router", "round_robin"),
        Contender("vllm-router cache_aware", "vllm-router", "cache_aware"),
        Contender("python floor round_robin", "python-floor", "round_robin"),
    ]
    if args.before is not None:
        contenders += [
            Contender("before: switchyard round_robin", "switchyard", "round_robin", args.before),
            Contender("before: switchyard lmetric", "switchyard", "lmetric", args.before),
        ]
    if args.router:
        contenders = [c for c in contenders if c.kind in args.router]
    if any(c.kind == "vllm-router" for c in contenders) and vllm_router_binary() is None:
        raise SystemExit(
            "vllm-router is not installed: .venv/bin/pip install -e '.[bench]' "
            f"(vllm-router=={VLLM_ROUTER_VERSION}), or pass --router switchyard"
        )
    concurrencies = args.concurrency or [1, 8, 64, 200]
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp, start_engines(2, 0.02, Path(tmp)) as (fleet, log):
        rows = side_by_side_rows(
            engine_ports(fleet),
            log,
            contenders,
            concurrencies,
            args.row_duration,
            args.rounds,
            args.max_words,
            Path(tmp),
            args.router_nice,
        )
    text = "\n".join(report(rows, args, load_start, os.getloadavg()))
    default = REPORT.with_name("sidebyside-nice.md") if args.router_nice else REPORT
    (args.report or default).write_text(text)
    print(text)


def before_note(tree: Path | None) -> list[str]:
    """The line naming the checkout the ``before:`` rows ran, if there are such rows."""
    if tree is None:
        return []
    commit = subprocess.run(
        ["git", "-C", str(tree), "log", "-1", "--format=%h %ad", "--date=short"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return [
        f"`before:` rows: Switchyard as checked out in {tree} ({commit or 'not a git checkout'}).",
        "",
    ]


def niceness_note(niceness: int) -> str:
    if not niceness:
        return (
            "Every process at the same priority (nice 0): from 64 streams on, the client and "
            "the engines keep both CPUs busy, and a routed request also waits for the "
            "router's turn on a CPU (`--router-nice -10` writes sidebyside-nice.md, the "
            "router given priority as router_worker/README advises)."
        )
    return (
        f"Each router process (all its threads) at nice {niceness}, the client and the "
        "engines at 0: the router given priority over other work on its host, as "
        "router_worker/README advises, the way it has a core of its own in a deployment "
        "(sidebyside.md has the rows with every process at nice 0)."
    )


def report(
    rows: list[Row],
    args: argparse.Namespace,
    load_start: tuple[float, float, float],
    load_end: tuple[float, float, float],
) -> list[str]:
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    return [
        "# Router overhead: Switchyard beside vllm-router",
        "",
        "Made by `python -m bench.router_overhead.run --only side-by-side"
        f"{f' --router-nice {args.router_nice}' if args.router_nice else ''}` on "
        f"{datetime.date.today()} "
        f"({machine}); vllm-router {VLLM_ROUTER_VERSION}; load average {load_start[0]:.1f} at "
        f"start, {load_end[0]:.1f} at the end. The machine is shared: a row's `load` is the "
        "1-minute load average as it started; rows well above 2 ran beside other work, and "
        "every process of the bench (client, engines, router) then waits for a CPU.",
        "",
        "Fleet: enginesim, 2 instances, H20 / Qwen2-7B, time scale 0.02. Each router alone "
        f"in front of it, {args.rounds} run(s) each in shuffled order; per run and row "
        f"{args.row_duration:g} s of closed-loop workers (`streams`) after 1 s not measured, "
        f"`/v1/completions` with `max_tokens` 2 and prompts of 2–{args.max_words} words "
        "unique from their first word; each request at random direct (one of the engines) "
        "or through the router, non-streamed or streamed.",
        "",
        niceness_note(args.router_nice),
        "",
        *before_note(args.before),
        "Added = routed − direct percentile, ms, median over the runs. `whole` (a "
        "non-streamed answer) and `first chunk` (a stream's first text event) are transits: "
        "the client's time minus the engine's own time for that request (its "
        "`--request-log`, joined on `X-Request-Id`: handler start → last byte, or → first "
        "token), so the engines' queueing, which the policies change, drops out; what is "
        "left is the path: loopback hops, the client's, the router's and the engine's "
        "socket handling, and the wait for a CPU. `headers` (a stream's response head) is "
        "as the client saw it: Switchyard holds it until the engine's first event (until "
        "then a failed attempt is retried unseen), so its `headers` include the engine's "
        "prefill, which the direct path's do not. `direct p50` = the direct path's own "
        "p50s (ms); failed = errors plus answers the engine's log does not have; CPU = the "
        "router process's CPU time per routed request (all its threads).",
        "",
        "`python floor` is the router's HTTP stack with nothing else (bench/lib/"
        "python_floor.py): the same uvicorn server and upstream transport, round robin, "
        "and none of Switchyard's per-request work (parsing, tokenizing, hashing, policy, "
        "lifecycle, metrics, limits). Switchyard's rows minus the floor's are the cost of "
        "that work; the floor's minus vllm-router's, the cost of a Python HTTP hop.",
        "",
        *summarise(rows),
        "",
        "## Against the goals",
        "",
        "Each Switchyard row held against the router overhead goals: added p50 ≤ 0.5 ms and "
        "p99 ≤ 2 ms at 1 stream, p50 ≤ 1 ms at 200 streams, and no more added than each "
        "vllm-router policy at the same concurrency. Each figure is the worse of `whole` and "
        "`first chunk` in the table above (ms). `p50 over the floor` and `CPU ÷ floor` set "
        "the row beside the Python floor measured in the same run: the part of the figures "
        "that is Switchyard's own work rather than the machine's.",
        "",
        *goal_table(rows),
        "",
        "## Switchyard's own time per stage",
        "",
        "Mean µs per request from `switchyard_router_stage_seconds` over each row (median "
        "over the runs): body = from the server parsing the request head to the handler "
        "having the body (the wait for the event loop included); intake = parse, check, "
        "tokenize, hash; decide = the policy's decision and the plan; connect = the "
        "upstream connection (idle pool or new); send = writing the request; engine = to "
        "the engine's response head; first_event = to its first event (streams) or whole "
        "answer; relay = writing that to the client, head included. engine and first_event "
        "are mostly the engine's own time.",
        "",
        *stage_table(rows),
        "",
    ]
