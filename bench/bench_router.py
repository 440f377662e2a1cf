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
0`` measures the router as the client's equal on that core: at 200 streams it then waits
for the CPU 12% of the time, and the added TTFT grows by 0.3–1 ms.
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
import contextlib
import itertools
import json
import multiprocessing
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httptools
import httpx
import numpy as np
import scipy.stats
import uvloop

from engine_interface import Histogram, percentile, read_histogram, read_samples

REPO = Path(__file__).resolve().parents[1]
TICKS = os.sysconf("SC_CLK_TCK")
T = TypeVar("T")
INSTANCES = 4
MODEL = "Qwen/Qwen2-7B-Instruct"


def run_async(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on uvloop: the client's CPU per chunk is a third of the default
    loop's, and what it does not spend the engines and routers can."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


def free_base_port(count: int) -> int:
    for base in range(32000, 60000, 89):
        try:
            for port in range(base, base + count):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError("no free ports")


def runnable_wait_seconds(pid: int) -> float:
    """Time the process's main thread (the router's event loop) spent runnable but waiting
    for a CPU (``/proc/<pid>/schedstat``, field 2): the OS's share of its latency."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9


def cpu_ticks() -> tuple[int, int]:
    """(steal, total) ticks of all CPUs since boot (``/proc/stat``): steal is the time the
    hypervisor ran someone else while this VM had work, which slows every process here."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return fields[7], sum(fields)


def steal_share(before: tuple[int, int], after: tuple[int, int]) -> float:
    total = after[1] - before[1]
    return (after[0] - before[0]) / total if total else 0.0


def set_cpus(pid: int, cpus: set[int]) -> None:
    """Restrict every thread of ``pid`` to ``cpus``."""
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(task), cpus)


PLACEMENTS = {
    "engines-apart": "engines on CPU 0; client and routers on the others (the engines run "
                     "alike in both arms; the router's CPU is taken from the client's)",
    "router-apart": "routers on the last CPU; engines and client on the others (the router "
                    "as deployed, on cores of its own; it also relieves the client)",
    "shared": "no pinning: client, engines and routers share every CPU",
}


@contextlib.contextmanager
def placed(placement: str, engines: subprocess.Popen[bytes],
           routers: list[subprocess.Popen[bytes]]) -> Iterator[str]:
    """Pin the processes for the TTFT rows (see PLACEMENTS), then unpin them all."""
    every = os.sched_getaffinity(0)
    if placement == "shared" or len(every) < 2:
        yield PLACEMENTS["shared"]
        return
    low, high = {min(every)}, {max(every)}
    if placement == "engines-apart":
        groups = [([engines.pid], low), ([os.getpid(), *(r.pid for r in routers)], every - low)]
    else:
        groups = [([os.getpid(), engines.pid], every - high), ([r.pid for r in routers], high)]
    try:
        for pids, cpus in groups:
            for pid in pids:
                set_cpus(pid, cpus)
        yield PLACEMENTS[placement]
    finally:
        for pid in [os.getpid(), engines.pid, *(r.pid for r in routers)]:
            set_cpus(pid, every)


def renice(pid: int, value: int) -> None:
    """Set the niceness of every thread of ``pid``."""
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):
            os.setpriority(os.PRIO_PROCESS, int(task), value)


@contextlib.contextmanager
def prioritised(routers: list[subprocess.Popen[bytes]], nice: int) -> Iterator[int]:
    """Run the routers at ``nice`` (every thread), as an operator gives a proxy priority
    over batch work on its host; back to 0 afterwards. Yields the niceness in force: 0
    when this process may not raise priorities (not root, no CAP_SYS_NICE)."""
    try:
        for router in routers:
            renice(router.pid, nice)
    except PermissionError:
        nice = 0
    try:
        yield nice
    finally:
        for router in routers:
            renice(router.pid, 0)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def wait_http(url: str, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(300):
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: process exited")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} never became ready")


@dataclass
class Cluster:
    """enginesim (``INSTANCES`` instances, one process) and two routers in front of it."""

    ports: list[int]
    engines: subprocess.Popen[bytes]
    routers: dict[str, tuple[int, subprocess.Popen[bytes]]]  # policy → (port, process)
    engine_log: EngineLog

    def stop(self) -> None:
        for proc in [self.engines, *(proc for _, proc in self.routers.values())]:
            proc.terminate()
            proc.wait(timeout=10)


@contextlib.contextmanager
def cluster(time_scale: float, workdir: Path, probe_url: str | None = None) -> Iterator[Cluster]:
    """enginesim at ``time_scale``, then routers in front of it: lmetric and round_robin
    (with ``probe_url``, each with a probe arm over that engine: see ``start_router``)."""
    ports, engines, log = start_engines(INSTANCES, time_scale, workdir)
    started = Cluster(ports, engines, {}, log)
    try:
        for port in ports:
            wait_http(f"http://127.0.0.1:{port}/health", engines)
        for policy in ("lmetric", "round_robin"):
            started.routers[policy] = start_router(ports, policy, workdir, probe_url)
        run_async(closed_loop([started.routers["lmetric"][0]], 8, 1.0, True, 4))  # warm-up
        yield started
    finally:
        started.stop()


def start_engines(count: int, time_scale: float,
                  workdir: Path) -> tuple[list[int], subprocess.Popen[bytes], EngineLog]:
    """One enginesim process serving ``count`` instances, with its request log."""
    base = free_base_port(count)
    log = workdir / f"engine-requests-{base}.jsonl"
    engines = subprocess.Popen(
        [sys.executable, "-m", "enginesim", "serve", "--instances", str(count),
         "--base-port", str(base), "--time-scale", str(time_scale), "--request-log", str(log)],
        cwd=REPO, stdout=subprocess.DEVNULL)
    return [base + k for k in range(count)], engines, EngineLog(log)


def start_router(ports: list[int], policy: str, workdir: Path,
                 probe_url: str | None = None) -> tuple[int, Any]:
    """A router over ``ports``. With ``probe_url``: a canary config whose ``load`` arm
    (weight 99) holds the engines and whose ``probe`` arm (weight 1) holds only the probe
    engine, both under ``policy``; requests pick their arm by ``X-Session-ID``."""
    spec = {"kind": policy, "params": {}}
    instances = [{"name": f"i{k}", "url": f"http://127.0.0.1:{p}"} for k, p in enumerate(ports)]
    config: dict[str, Any] = {"model": MODEL, "policy": spec, "instances": instances,
                              "router": {"max_concurrency": 4096}}
    if probe_url:
        config["instances"] = [*instances, {"name": "probe", "url": probe_url}]
        config["canary"] = {"arms": [
            {"name": "load", "policy": spec, "weight": 99,
             "instances": [i["name"] for i in instances]},
            {"name": "probe", "policy": spec, "weight": 1, "instances": ["probe"]}]}
    path = workdir / f"router-{policy}.json"
    path.write_text(json.dumps(config))
    router_port = free_base_port(1)
    router = subprocess.Popen(
        [sys.executable, "-m", "router_worker", "--config", str(path), "--port",
         str(router_port), "--redis-url", "none", "--log-level", "WARNING"],
        cwd=REPO, stdout=subprocess.DEVNULL)
    wait_http(f"http://127.0.0.1:{router_port}/health", router)
    return router_port, router


class _Exchange:
    """httptools callbacks for one response: SSE events counted, the first token timed."""

    def __init__(self) -> None:
        self.first: float | None = None  # monotonic s at the first SSE line with a token
        self.events = 0
        self.tail = b""
        self.complete = False
        self.keep_alive = False
        self.parser: httptools.HttpResponseParser | None = None

    def on_headers_complete(self) -> None:
        # Read now: llhttp resets its flags once the message completes.
        assert self.parser is not None
        self.keep_alive = self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        # Cheap (no line splitting: the client must not be what limits the run); the
        # tail keeps a marker split between two reads.
        data = self.tail + body
        self.events += data.count(b"data: ") - self.tail.count(b"data: ")
        if self.first is None and b'"text":"' in data:
            self.first = time.monotonic()
        self.tail = data[-7:]

    def on_message_complete(self) -> None:
        self.complete = True


@dataclass(slots=True)
class Outcome:
    """One answered request, client side; times are ``time.monotonic()`` (the clock of the
    engines' ``--request-log``)."""

    request_id: str
    sent: float
    first: float | None  # first token (streams)
    done: float
    events: int  # SSE data events (0 for non-streamed answers)


class _StaleConnection(Exception):
    """The connection ended before any byte of the response."""


class Client:
    """One keep-alive connection per engine or router port, as a production client (or
    the router towards the engines) keeps: accepting a connection per request in an
    already busy enginesim would be measured as engine latency."""

    def __init__(self) -> None:
        self.connections: dict[int, tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}

    async def request(self, port: int, body: bytes, request_id: str,
                      session: str | None = None) -> Outcome | None:
        """Send one request with ``X-Request-Id: request_id`` (and ``X-Session-ID:
        session``); None when it failed."""
        extra = b"X-Session-ID: %s\r\n" % session.encode() if session else b""
        head = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\nX-Request-Id: %s\r\n%s"
                b"Content-Length: %d\r\n\r\n" % (request_id.encode(), extra, len(body)))
        for _ in range(2):
            reused = port in self.connections
            if reused and self.connections[port][0].at_eof():
                self.drop(port)  # the server closed it while idle (keep-alive timeout)
                reused = False
            if not reused:
                self.connections[port] = await asyncio.open_connection("127.0.0.1", port)
            try:
                return await self._exchange(port, head + body, request_id)
            except _StaleConnection:
                if not reused:
                    return None
                # Closed while idle just as we sent: the request never got in; once more
                # on a fresh connection, as HTTP clients do.
        return None

    async def _exchange(self, port: int, request: bytes, request_id: str) -> Outcome | None:
        reader, writer = self.connections[port]
        exchange = _Exchange()
        parser = exchange.parser = httptools.HttpResponseParser(exchange)
        sent = time.monotonic()  # connecting is not part of a request's latency
        writer.write(request)
        received = False
        try:
            while not exchange.complete:
                data = await reader.read(65536)
                if not data:
                    raise ConnectionError("closed by the server")
                received = True
                parser.feed_data(data)
        except (ConnectionError, httptools.HttpParserError):
            self.drop(port)
            if not received:
                raise _StaleConnection from None
            return None
        if not exchange.keep_alive:
            self.drop(port)
        if parser.get_status_code() != 200:
            return None
        return Outcome(request_id, sent, exchange.first, time.monotonic(), exchange.events)

    def drop(self, port: int) -> None:
        _, writer = self.connections.pop(port)
        writer.close()

    def close(self) -> None:
        for port in list(self.connections):
            self.drop(port)


class Run:
    """One closed-loop run: what the client saw, failures and wall time."""

    def __init__(self, stream: bool) -> None:
        self.stream = stream
        self.outcomes: list[Outcome] = []
        self.failures = 0
        self.elapsed = 0.0  # seconds after the warm-up
        self.wall = 0.0  # seconds in all

    @property
    def samples(self) -> list[float]:
        """TTFT (streams) or latency (non-streamed), seconds."""
        if self.stream:
            return [o.first - o.sent for o in self.outcomes if o.first is not None]
        return [o.done - o.sent for o in self.outcomes]

    @property
    def events(self) -> int:
        return sum(o.events for o in self.outcomes)


def make_prompt(shared: str, head: str, words: int) -> str:
    """``shared`` (a common prefix, maybe empty), ``head``, then filler up to about
    ``words`` words in all (enginesim: about a token each)."""
    filler = ["lorem", "ipsum", "dolor", "sit", "amet"]
    count = words - len(shared.split()) - len(head.split())
    return shared + head + " " + " ".join(filler[k % len(filler)] for k in range(count))


def system_prompt(nonce: int, words: int) -> str:
    """A run's shared prefix (a chat app's system prompt): the same for every request of
    the run, new for each run."""
    if not words:
        return ""
    return f"system {nonce} " + " ".join(f"rule{k}" for k in range(words - 2)) + " "


async def run_loop(ports: list[int], concurrency: int, duration: float, stream: bool,
                   max_tokens: int, prompt_words: int = 60, warmup: float = 0.0,
                   shared_words: int = 0, sessions: list[str] | None = None) -> Run:
    """``concurrency`` workers, each sending its next request when the last one ends,
    for ``duration`` s. With ``warmup``, the workers start spread over that many seconds
    (not all at once: a burst of simultaneous arrivals is not the steady state) and what
    was sent before it ends is not kept. ``sessions[n]``: worker n's ``X-Session-ID``."""
    run = Run(stream)
    begin = time.monotonic()
    deadline = time.perf_counter() + warmup + duration
    # A fresh prefix per run: a prompt repeated from an earlier run would hit the engines'
    # prefix cache and make whichever path runs later look faster.
    nonce = time.perf_counter_ns()
    shared = system_prompt(nonce, shared_words)
    # One round robin over the ports shared by all workers, like the router's: a per-worker
    # rotation leaves some engines with more streams than others at any moment, which on a
    # prefill-bound engine doubled direct TTFT and made the router look faster than direct.
    turns = itertools.count()

    async def worker(n: int) -> None:
        k = 0
        client = Client()
        await asyncio.sleep(warmup * n / concurrency)
        while time.perf_counter() < deadline:
            request_id = f"{nonce}-{n}-{k}"
            prompt = make_prompt(shared, f"run {nonce} client {n} request {k}", prompt_words)
            body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens,
                               "stream": stream}).encode()
            outcome = await client.request(ports[next(turns) % len(ports)], body, request_id,
                                           sessions[n] if sessions else None)
            if outcome is None:
                run.failures += 1
            elif outcome.sent >= begin + warmup:
                run.outcomes.append(outcome)
            k += 1
        client.close()

    await asyncio.gather(*(worker(n) for n in range(concurrency)))
    run.wall = time.monotonic() - begin
    run.elapsed = run.wall - warmup
    return run


async def closed_loop(ports: list[int], concurrency: int, duration: float, stream: bool,
                      max_tokens: int) -> tuple[list[float], int, float]:
    run = await run_loop(ports, concurrency, duration, stream, max_tokens)
    return run.samples, run.failures, run.elapsed


class EngineLog:
    """The engines' ``--request-log``, read incrementally: request id → timing record."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.records: dict[str, dict[str, Any]] = {}

    def engine_ttft(self, run: Run, wait: float = 5.0) -> dict[str, float]:
        """The engine's own TTFT (handler start → first content chunk) of each of ``run``'s
        streams, by request id; waits for records still being written."""
        wanted = {o.request_id for o in run.outcomes if o.first is not None}
        deadline = time.monotonic() + wait
        while True:
            self._read()
            found = {rid: rec["first_token"] - rec["arrival"]
                     for rid in wanted
                     if (rec := self.records.get("cmpl-" + rid)) and rec["first_token"]}
            if len(found) == len(wanted) or time.monotonic() > deadline:
                return found
            time.sleep(0.05)

    def _read(self) -> None:
        if not self.path.exists():
            return
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            data = handle.read()
        complete = data.rfind(b"\n") + 1
        self.offset += complete
        for line in data[:complete].splitlines():
            record = json.loads(line)
            self.records[record["request_id"]] = record


def transit(run: Run, engine_ttft: dict[str, float]) -> list[float]:
    """Per stream: client-observed TTFT minus the engine's own TTFT (s). What the path
    between client and engine costs — loopback, the client's and the engine's socket
    handling, and in routed runs everything the router adds (its CPU, its event loop's
    queue) — without the engine's queueing and prefill, which vary with load and
    placement and would swamp a millisecond."""
    return [o.first - o.sent - engine_ttft[o.request_id] for o in run.outcomes
            if o.first is not None and o.request_id in engine_ttft]


HOT_PATH = ("tokenize", "hashing", "decision", "overhead", "loop_lag")


def router_histograms(port: int) -> dict[str, Histogram]:
    """The router's hot-path histograms (every label set merged), by short name."""
    names = {short: f"switchyard_router_{short}_seconds" for short in HOT_PATH}
    samples, _ = read_samples(httpx.get(f"http://127.0.0.1:{port}/metrics").text,
                              list(names.values()))
    return {short: read_histogram(samples, name) or Histogram() for short, name in names.items()}


def bucket_quantile(before: dict[str, Histogram], after: dict[str, Histogram], name: str,
                    q: float = 50) -> float:
    """Upper bound (s) of the bucket holding percentile ``q`` (0..100) of the observations
    between two scrapes (inf when it lies beyond the last bucket, nan without
    observations)."""
    bound = after[name].since(before[name]).quantile_bound(q)
    return float("nan") if bound is None else bound


def pct(values: list[float], q: float) -> float:
    found = percentile(values, q)
    return found * 1000 if found is not None else float("nan")


def hot_path_rows() -> None:
    """Tokenize + hash + decide in-process (CPU time, no network): the stable figure."""
    from router_worker.routing import ClusterState, build_features, make_policy
    from router_worker.tokenization import Tokenizer

    print("\nHot path in-process, lmetric over 16 instances with a warm KV index "
          "(CPU µs per request)")
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
            ids, _ = tokenizer.encode_chat([{"role": "system", "content": shared},
                                            {"role": "user", "content": f"question {n}"}])
            t1 = time.process_time()
            features = build_features(f"r{n}", ids, n * 0.01)
            t2 = time.process_time()
            decision = policy.decide(features, view, n * 0.01)
            t3 = time.process_time()
            state.on_dispatch(features, decision.instance_id, n * 0.01,
                              cached_tokens=decision.cached_tokens)
            state.on_finish(features.request_id, n * 0.01)
            timings += (t1 - t0, t2 - t1, t3 - t2)
        tok, hashing, decide = timings / rounds * 1e6
        print(f"{chars:>12} {tok:>9.1f} {hashing:>7.1f} {decide:>7.1f} "
              f"{tok + hashing + decide:>7.1f}")


def measure_cpu(ports: list[int], pid: int, concurrency: int, duration: float, stream: bool,
                max_tokens: int) -> tuple[Run, float]:
    """A closed-loop run and the CPU seconds process ``pid`` spent during it."""
    cpu0 = cpu_seconds(pid)
    run = run_async(run_loop(ports, concurrency, duration, stream, max_tokens))
    return run, cpu_seconds(pid) - cpu0


def cpu_rows(ports: list[int], router_port: int, router: subprocess.Popen[bytes],
             engines: subprocess.Popen[bytes], args: argparse.Namespace) -> None:
    """CPU time per request and per streamed chunk: the robust figure on a shared machine.

    Per chunk: the slope between streams of ``SHORT`` and ``LONG`` tokens (CPU per request
    against SSE events per request), so the fixed per-request part drops out; per stream:
    the intercept. Router rows: the router process only (enginesim's CPU is not in them);
    direct rows: the enginesim process serving the same requests without the router.
    """
    short, long_, concurrency = 4, 64, 32
    print(f"\nCPU time per request and per SSE chunk (µs of process CPU, /proc/<pid>/stat), "
          f"{concurrency} in flight, load average {os.getloadavg()[0]:.1f}")
    header = (f"{'process':>20} {'non-stream/req':>14} {f'stream {short} tok/req':>16} "
              f"{f'stream {long_} tok/req':>17} {'per stream':>10} {'per chunk':>9}")
    print(header)
    print("-" * len(header))
    rows = {}
    for label, targets, pid in (("enginesim (direct)", ports, engines.pid),
                                ("router", [router_port], router.pid)):
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
        print(f"{label:>20} " + " ".join(f"{v * 1e6:>{w}.0f}" for v, w in
                                        zip(values, (14, 16, 17, 10, 9), strict=True)),
              flush=True)
    ratio = [r / d if d else float("nan")
             for r, d in zip(rows["router"], rows["enginesim (direct)"], strict=True)]
    print(f"{'router / direct':>20} " + " ".join(f"{v:>{w}.2f}" for v, w in
                                                zip(ratio, (14, 16, 17, 10, 9), strict=True)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=6.0,
                        help="seconds per run of the throughput and CPU rows")
    parser.add_argument("--time-scale", type=float, default=0.05,
                        help="enginesim time scale of the throughput and CPU rows")
    parser.add_argument("--ttft-duration", type=float, default=20.0,
                        help="seconds per arm and row of the TTFT rows")
    parser.add_argument("--ttft-warmup", type=float, default=10.0,
                        help="seconds over which a TTFT row's streams start, not measured")
    parser.add_argument("--ttft-time-scale", type=float, default=1.0,
                        help="enginesim time scale of the TTFT rows (1: an H20's speed)")
    parser.add_argument("--max-tokens", type=int, default=128,
                        help="answer length of the TTFT rows (the Azure conversation "
                             "trace's median output is 129 tokens)")
    parser.add_argument("--prompt-tokens", type=int, default=1000,
                        help="prompt length of the TTFT rows (that trace's median input is "
                             "1,020 tokens)")
    parser.add_argument("--shared-prefix-tokens", type=int, default=900,
                        help="of which a system prompt shared by all requests of a run (the "
                             "engines cache it; the router still tokenizes and hashes it)")
    parser.add_argument("--probe-share", type=float, default=0.25,
                        help="direct streams run beside a TTFT row's routed ones, as a share "
                             "of them (at least one)")
    parser.add_argument("--concurrency", type=int, action="append",
                        help="TTFT rows' concurrent streams (repeatable; default 1, 50, 200)")
    parser.add_argument("--probe-rate", type=float, default=20.0,
                        help="probes per second of the prober rows (half through the router)")
    parser.add_argument("--only", choices=("ttft", "probe", "throughput", "cpu", "hot-path"),
                        action="append", help="run only these sections (repeatable)")
    parser.add_argument("--placement", choices=sorted(PLACEMENTS), default="engines-apart",
                        help="CPU pinning for the TTFT rows (throughput and CPU rows: shared)")
    parser.add_argument("--router-nice", type=int, default=-10,
                        help="scheduling niceness of the routers (and the prober) in the TTFT "
                             "and prober rows: negative, they preempt the load client on a "
                             "shared CPU, as on a host of their own; needs root or "
                             "CAP_SYS_NICE, else 0. 0: the router shares its CPU with the "
                             "client as an equal")
    args = parser.parse_args()
    sections = set(args.only or ("ttft", "probe", "throughput", "cpu", "hot-path"))
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    print(f"# router overhead vs enginesim direct ({machine})")
    print(f"# load average at start: {os.getloadavg()[0]:.1f}")
    print(f"# {INSTANCES} enginesim instances h20/qwen2-7b; routers lmetric and round_robin, "
          "approx tokenizer")
    with tempfile.TemporaryDirectory() as tmp:
        if "ttft" in sections:
            with cluster(args.ttft_time_scale, Path(tmp)) as slow:
                engines = slow.engines
                routers = [proc for _, proc in slow.routers.values()]
                with (placed(args.placement, engines, routers) as placement,
                      prioritised(routers, args.router_nice) as args.router_nice):
                    print(f"\n# TTFT rows: {placement}; routers at nice {args.router_nice}")
                    ttft_rows(slow, args)
        if "probe" in sections:
            with (probe_engine(Path(tmp)) as probe,
                  cluster(args.ttft_time_scale, Path(tmp), probe.url) as slow):
                routers = [proc for _, proc in slow.routers.values()]
                with (placed(args.placement, slow.engines, routers) as placement,
                      prioritised(routers, args.router_nice) as args.router_nice):
                    print(f"\n# prober rows: {placement}; routers and prober at nice "
                          f"{args.router_nice}; "
                          "the prober and its engine are not pinned")
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


def ttft_arm(setup: Cluster, policy: str, concurrency: int,
             args: argparse.Namespace) -> ArmResult:
    """``concurrency`` streams through the ``policy`` router and, at the same time, a
    quarter as many straight to the engines (the baseline: the same engines, client and
    moment, so what the machine does to both cancels out)."""
    port, proc = setup.routers[policy]
    probes = max(1, round(concurrency * args.probe_share))

    def loop(ports: list[int], streams: int) -> Coroutine[Any, Any, Run]:
        return run_loop(ports, streams, args.ttft_duration, True, args.max_tokens,
                        args.prompt_tokens, args.ttft_warmup, args.shared_prefix_tokens)

    async def both() -> list[Run]:
        return await asyncio.gather(loop([port], concurrency), loop(setup.ports, probes))

    cpu0, wait0, before = (cpu_seconds(proc.pid), runnable_wait_seconds(proc.pid),
                           router_histograms(port))
    ticks = cpu_ticks()
    routed, direct = run_async(both())
    after = router_histograms(port)
    engine = setup.engine_log.engine_ttft(routed) | setup.engine_log.engine_ttft(direct)
    return ArmResult(
        routed, direct, engine,
        cpu=(cpu_seconds(proc.pid) - cpu0) / routed.wall,
        cpu_wait=(runnable_wait_seconds(proc.pid) - wait0) / routed.wall,
        side=[bucket_quantile(before, after, name, q)
              for name in ("overhead", "loop_lag") for q in (50, 99)],
        steal=steal_share(ticks, cpu_ticks()))


def ttft_rows(setup: Cluster, args: argparse.Namespace) -> None:
    """Added TTFT at 1, 50 and 200 concurrent streams through the round-robin and the
    lmetric router, each against direct probe streams run at the same time.

    Client-observed TTFT includes the engines' queueing and prefill, which differ between
    runs by far more than a millisecond (and between policies by design). So each stream's
    *transit* is measured: client TTFT minus the engine's own TTFT for that request (from
    its ``--request-log``, joined on X-Request-Id, one monotonic clock). Added = routed
    transit − direct transit, per percentile: everything the router costs a stream on its
    way to its first token, queueing in the router's event loop included."""
    print(f"\nTTFT, streams of {args.prompt_tokens}-token prompts ({args.shared_prefix_tokens} "
          f"of them a shared system prompt) and {args.max_tokens}-token answers, enginesim "
          f"time scale {args.ttft_time_scale:g}, {args.ttft_warmup:g}s ramp then "
          f"{args.ttft_duration:g}s closed loop per row; direct = {args.probe_share:.0%} as "
          "many streams straight to the engines at the same time (ms). engine = the engine's "
          "own TTFT (handler start → first token chunk); transit = client TTFT − engine TTFT; "
          "added = routed transit − direct transit, with its 95% bootstrap interval; own = "
          "the router's histogram of its time in the first chunk, lag = how late its event "
          "loop runs a due timer (bucket upper bounds); CPU = router process CPU, wait = its "
          "runnable-without-CPU share, steal = the share of the machine's CPU time the "
          "hypervisor took (rows with a few % of it are slowed by other tenants)")
    header = (f"{'streams':>7} {'router':>11} {'n':>5} {'direct n':>8} {'TTFT p50':>9} "
              f"{'p99':>7} {'direct p50':>10} {'p99':>7} {'engine p50':>10} {'p99':>7} "
              f"{'transit p50':>11} {'p99':>6} {'direct p50':>10} {'p99':>6} "
              f"{'added p50':>9} {'95% interval':>15} {'p99':>6} {'95% interval':>15} "
              f"{'own p50':>7} {'p99':>5} "
              f"{'lag p50':>7} {'p99':>5} {'CPU':>4} {'wait':>4} {'steal':>5}")
    each_row(setup, args, header,
             lambda streams, policy: ttft_line(streams, policy,
                                               ttft_arm(setup, policy, streams, args)))


def each_row(setup: Cluster, args: argparse.Namespace, header: str,
             row: Callable[[int, str], str]) -> None:
    """Print ``header`` and a row per stream count and router, the other router paused."""
    print(header)
    print("-" * len(header))
    for concurrency in args.concurrency or (1, 50, 200):
        for policy in ("round_robin", "lmetric"):
            with paused(r for p, r in setup.routers.items() if p != policy):
                line = row(concurrency, policy)
            print(line, flush=True)


PROBE_TIME_SCALE = 0.1  # the probe engine's TTFT is subtracted: it only has to stay idle
PROBE_MAX_TOKENS = 2  # a probe ends right after its first token


@dataclass
class ProbeEngine:
    """A one-instance enginesim of its own (own process, own event loop), which only the
    prober's requests reach: its TTFT is short and steady, and it logs each request."""

    port: int
    process: subprocess.Popen[bytes]
    log: EngineLog

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextlib.contextmanager
def probe_engine(workdir: Path) -> Iterator[ProbeEngine]:
    ports, process, log = start_engines(1, PROBE_TIME_SCALE, workdir)
    try:
        wait_http(f"http://127.0.0.1:{ports[0]}/health", process)
        yield ProbeEngine(ports[0], process, log)
    finally:
        process.terminate()
        process.wait(timeout=10)


def sessions_in_arm(prefix: str, low: float, high: float) -> Iterator[str]:
    """Session keys the router assigns to the canary arm owning points [low, high)."""
    from router_worker.arms import session_point
    from router_worker.routing import session_key_from_request

    def point(key: str) -> float:  # as the router derives it from the header
        return session_point(session_key_from_request({"x-session-id": key}, {}) or "")

    return (key for key in (f"{prefix}-{k}" for k in itertools.count())
            if low <= point(key) < high)


@dataclass(frozen=True)
class ProbePlan:
    router_port: int
    engine_port: int
    session: str  # puts the routed probes in the router's probe arm
    start_at: float  # time.monotonic() (system-wide) when probing starts
    duration: float
    rate: float  # probes per second, both paths together
    prompt_words: int
    shared_words: int


async def probe_loop(plan: ProbePlan) -> list[tuple[str, Outcome | None]]:
    """Two workers, each alternating a probe through the router and one straight to the
    probe engine, with exponential gaps (Poisson arrivals see the router's time-average
    state); probes share a system prompt, as the load does."""
    nonce = time.perf_counter_ns()
    shared = system_prompt(nonce, plan.shared_words)
    gaps = np.random.default_rng(nonce).exponential(2 / plan.rate, 100_000).tolist()
    results: list[tuple[str, Outcome | None]] = []
    await asyncio.sleep(max(plan.start_at - time.monotonic(), 0.0))
    deadline = plan.start_at + plan.duration

    async def worker(n: int) -> None:
        client = Client()
        for k in itertools.count():
            if time.monotonic() >= deadline:
                break
            path = ("routed", "direct")[(n + k) % 2]
            request_id = f"probe-{nonce}-{n}-{k}"
            body = json.dumps({"model": MODEL, "max_tokens": PROBE_MAX_TOKENS, "stream": True,
                               "prompt": make_prompt(shared, f"probe {request_id}",
                                                     plan.prompt_words)}).encode()
            if path == "routed":
                outcome = await client.request(plan.router_port, body, request_id, plan.session)
            else:
                outcome = await client.request(plan.engine_port, body, request_id)
            results.append((path, outcome))
            await asyncio.sleep(gaps.pop())
        client.close()

    await asyncio.gather(worker(0), worker(1))
    return results


def prober(plan: ProbePlan, pipe: Any) -> None:
    """Entry point of the prober process: a client of its own whose event loop is idle
    between probes, so its timestamps are not delayed by the load's 200 streams."""
    pipe.send(run_async(probe_loop(plan)))


@dataclass
class ProbeResult:
    load: Run
    routed: list[float]  # transit (s) of probes through the router
    direct: list[float]  # transit (s) of probes straight to the probe engine
    engine: list[float]  # the probe engine's own TTFT (s)
    failures: int
    cpu: float
    cpu_wait: float
    side: list[float]
    steal: float


def probe_transits(results: list[tuple[str, Outcome | None]], probe: ProbeEngine
                   ) -> tuple[list[float], list[float], list[float], int]:
    """Transits (s) of the routed and the direct probes, the probe engine's TTFTs (s) and
    the number of failed probes."""
    paths: dict[str, Run] = {"routed": Run(True), "direct": Run(True)}
    failures = 0
    for path, outcome in results:
        if outcome is None:
            failures += 1
        else:
            paths[path].outcomes.append(outcome)
    engine_ttft = probe.log.engine_ttft(paths["routed"]) | probe.log.engine_ttft(paths["direct"])
    return (transit(paths["routed"], engine_ttft), transit(paths["direct"], engine_ttft),
            list(engine_ttft.values()), failures)


@contextlib.contextmanager
def nginx_in_front(upstream: int, workdir: Path) -> Iterator[int | None]:
    """nginx as a streaming reverse proxy to port ``upstream`` (keep-alive upstream, no
    buffering); yields its port, or None when nginx is not installed."""
    binary = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin")
    if binary is None:
        yield None
        return
    port = free_base_port(1)
    conf = workdir / f"nginx-{port}.conf"
    conf.write_text(NGINX_CONF.format(workdir=workdir, port=port, upstream=upstream))
    process = subprocess.Popen([binary, "-c", str(conf), "-p", str(workdir)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", process)
        yield port
    finally:
        process.terminate()
        process.wait(timeout=10)


NGINX_CONF = """worker_processes 1; daemon off; pid {workdir}/nginx.pid;
error_log {workdir}/nginx-error.log;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  upstream engine {{ server 127.0.0.1:{upstream}; keepalive 64; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://engine; proxy_http_version 1.1; proxy_set_header Connection "";
      proxy_buffering off; proxy_request_buffering off;
    }}
  }}
}}
"""


def reference_hop(probe: ProbeEngine, args: argparse.Namespace, workdir: Path) -> str:
    """The prober's added TTFT through nginx instead of the router, with no load: what any
    extra loopback hop through a proxy costs on this machine (the floor of the rows)."""
    with nginx_in_front(probe.port, workdir) as port:
        if port is None:
            return "reference: nginx is not installed (apt install nginx-light), row skipped"
        plan = ProbePlan(port, probe.port, "", time.monotonic() + 1.0, args.ttft_duration,
                         args.probe_rate, args.prompt_tokens, args.shared_prefix_tokens)
        ticks = cpu_ticks()
        routed, direct, _, failures = probe_transits(run_async(probe_loop(plan)), probe)
        steal = steal_share(ticks, cpu_ticks())
    return (f"reference: the same probes through nginx (C, one worker) instead of a router, "
            f"no load: n {len(routed)}/{len(direct)}, added p50 "
            f"{pct(routed, 50) - pct(direct, 50):.2f} {added_interval(routed, direct, 50)}, "
            f"p99 {pct(routed, 99) - pct(direct, 99):.2f} {added_interval(routed, direct, 99)}, "
            f"steal {steal:.1%}" + (f" ({failures} failed)" if failures else ""))


def probe_arm(setup: Cluster, probe: ProbeEngine, policy: str, concurrency: int,
              args: argparse.Namespace) -> ProbeResult:
    """``concurrency`` load streams through the ``policy`` router's load arm while a
    separate prober process times probes through its probe arm and direct."""
    port, proc = setup.routers[policy]
    load_sessions = list(itertools.islice(sessions_in_arm("load", 0, 99), concurrency))
    plan = ProbePlan(port, probe.port, next(sessions_in_arm("probe", 99, 100)),
                     time.monotonic() + args.ttft_warmup, args.ttft_duration, args.probe_rate,
                     args.prompt_tokens, args.shared_prefix_tokens)
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=prober, args=(plan, sender))
    process.start()
    if args.router_nice:  # else a prioritised router would delay the prober's direct probes
        renice(process.pid, args.router_nice)  # (allowed: the routers' renice was)
    cpu0, wait0, before = (cpu_seconds(proc.pid), runnable_wait_seconds(proc.pid),
                           router_histograms(port))
    ticks = cpu_ticks()
    load = run_async(run_loop([port], concurrency, args.ttft_duration, True, args.max_tokens,
                              args.prompt_tokens, args.ttft_warmup, args.shared_prefix_tokens,
                              load_sessions))
    results = receiver.recv()
    process.join()
    after = router_histograms(port)
    return ProbeResult(
        load, *probe_transits(results, probe),
        cpu=(cpu_seconds(proc.pid) - cpu0) / load.wall,
        cpu_wait=(runnable_wait_seconds(proc.pid) - wait0) / load.wall,
        side=[bucket_quantile(before, after, name, q)
              for name in ("overhead", "loop_lag") for q in (50, 99)],
        steal=steal_share(ticks, cpu_ticks()))


def probe_rows(setup: Cluster, probe: ProbeEngine, args: argparse.Namespace,
               workdir: Path) -> None:
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
    print(f"\nAdded TTFT seen by a prober: a separate process sends {args.probe_rate:g} probes/s "
          f"({args.prompt_tokens}-token prompts, {PROBE_MAX_TOKENS}-token answers), half through "
          "the router's probe arm and half straight to an idle probe engine of their own "
          f"(time scale {PROBE_TIME_SCALE:g}), while the router's load arm carries the streams "
          f"of the TTFT rows ({args.ttft_warmup:g}s ramp, then {args.ttft_duration:g}s "
          "measured; ms; added = routed − direct probe transit with its 95% bootstrap "
          "interval; own, lag, CPU, wait, steal as above)")
    header = (f"{'streams':>7} {'router':>11} {'load req/s':>10} {'chunks/s':>8} "
              f"{'probes':>9} {'engine p50':>10} {'routed p50':>10} {'p99':>6} "
              f"{'direct p50':>10} {'p99':>6} {'added p50':>9} {'95% interval':>15} "
              f"{'p99':>6} {'95% interval':>15} {'own p50':>7} {'p99':>5} {'lag p50':>7} "
              f"{'p99':>5} {'CPU':>4} {'wait':>4} {'steal':>5}")
    each_row(setup, args, header,
             lambda streams, policy: probe_line(streams, policy,
                                                probe_arm(setup, probe, policy, streams, args)))
    with paused(setup.routers.values()):
        print(reference_hop(probe, args, workdir), flush=True)


def probe_line(concurrency: int, policy: str, result: ProbeResult) -> str:
    routed, direct, load = result.routed, result.direct, result.load
    own50, own99, lag50, lag99 = (f"≤{v * 1000:g}" for v in result.side)
    failures = result.failures + load.failures
    return (f"{concurrency:>7} {policy:>11} {len(load.outcomes) / load.elapsed:>10.1f} "
            f"{load.events / load.elapsed:>8.0f} {f'{len(routed)}/{len(direct)}':>9} "
            f"{pct(result.engine, 50):>10.2f} {pct(routed, 50):>10.2f} {pct(routed, 99):>6.2f} "
            f"{pct(direct, 50):>10.2f} {pct(direct, 99):>6.2f} "
            f"{pct(routed, 50) - pct(direct, 50):>9.2f} "
            f"{added_interval(routed, direct, 50):>15} "
            f"{pct(routed, 99) - pct(direct, 99):>6.2f} {added_interval(routed, direct, 99):>15} "
            f"{own50:>7} {own99:>5} {lag50:>7} {lag99:>5} {result.cpu:>4.0%} "
            f"{result.cpu_wait:>4.0%} {result.steal:>5.1%}"
            + (f"  ({failures} failed)" if failures else ""))


def added_interval(moved: list[float], base: list[float], q: float) -> str:
    """95% bootstrap interval (ms) of percentile ``q`` of routed transit minus that of
    direct transit: how well the run pins the added latency down."""
    if len(moved) < 2 or len(base) < 2:
        return "n/a"

    def difference(a: np.ndarray, b: np.ndarray, axis: int) -> np.ndarray:
        return np.percentile(a, q, axis=axis) - np.percentile(b, q, axis=axis)

    result = scipy.stats.bootstrap((np.asarray(moved), np.asarray(base)), difference,
                                   n_resamples=2000, method="percentile",
                                   random_state=np.random.default_rng(0))
    low, high = result.confidence_interval
    return f"[{low * 1000:.1f}, {high * 1000:.1f}]"


def ttft_line(concurrency: int, policy: str, arm: ArmResult) -> str:
    routed, direct = arm.routed, arm.direct
    moved, base = arm.transit(routed), arm.transit(direct)
    engine = [arm.engine_ttft[o.request_id] for o in routed.outcomes
              if o.request_id in arm.engine_ttft]
    own50, own99, lag50, lag99 = (f"≤{v * 1000:g}" for v in arm.side)
    failures = routed.failures + direct.failures
    return (f"{concurrency:>7} {policy:>11} {len(routed.outcomes):>5} "
            f"{len(direct.outcomes):>8} {pct(routed.samples, 50):>9.1f} "
            f"{pct(routed.samples, 99):>7.1f} {pct(direct.samples, 50):>10.1f} "
            f"{pct(direct.samples, 99):>7.1f} {pct(engine, 50):>10.1f} {pct(engine, 99):>7.1f} "
            f"{pct(moved, 50):>11.2f} {pct(moved, 99):>6.2f} {pct(base, 50):>10.2f} "
            f"{pct(base, 99):>6.2f} {pct(moved, 50) - pct(base, 50):>9.2f} "
            f"{added_interval(moved, base, 50):>15} {pct(moved, 99) - pct(base, 99):>6.2f} "
            f"{added_interval(moved, base, 99):>15} {own50:>7} {own99:>5} {lag50:>7} "
            f"{lag99:>5} {arm.cpu:>4.0%} {arm.cpu_wait:>4.0%} {arm.steal:>5.1%}"
            + (f"  ({failures} failed)" if failures else ""))


@contextlib.contextmanager
def paused(routers: Iterable[tuple[int, subprocess.Popen[bytes]]]) -> Iterator[None]:
    """Stop the routers not under test (SIGSTOP): their scrapes and health probes would
    stall the engines' event loop in the other arms' runs."""
    stopped = [proc for _, proc in routers]
    for proc in stopped:
        proc.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        for proc in stopped:
            proc.send_signal(signal.SIGCONT)


def throughput_rows(ports: list[int], router_port: int, router: subprocess.Popen[bytes],
                    engines: subprocess.Popen[bytes], args: argparse.Namespace) -> None:
    concurrency = 64
    engine0 = cpu_seconds(engines.pid)
    direct, _, elapsed_d = run_async(closed_loop(ports, concurrency, args.duration, False, 4))
    engine_per_request = (cpu_seconds(engines.pid) - engine0) / max(len(direct), 1)
    before = router_histograms(router_port)
    cpu0 = cpu_seconds(router.pid)
    routed, _, elapsed_r = run_async(closed_loop([router_port], concurrency, args.duration,
                                                   False, 4))
    router_cpu = cpu_seconds(router.pid) - cpu0
    after = router_histograms(router_port)
    rps_d, rps_r = len(direct) / elapsed_d, len(routed) / elapsed_r
    per_request = router_cpu / max(len(routed), 1)
    print(f"\nThroughput, non-streamed max_tokens=4, {concurrency} in flight")
    print(f"{'direct req/s':>12} {'router req/s':>12} {'ratio':>6} {'engine CPU/req':>14} "
          f"{'router CPU/req':>14} {'router req/CPU-s':>16}")
    print(f"{rps_d:>12.0f} {rps_r:>12.0f} {rps_r / rps_d:>6.2f} "
          f"{engine_per_request * 1e6:>12.0f}µs {per_request * 1e6:>12.0f}µs "
          f"{1 / per_request:>16.0f}")
    count = after["decision"].count - before["decision"].count
    print("\nRouter hot path per request (its own histograms, wall clock): median bucket, "
          "mean, and the mean's share of the router's CPU time per request")
    for name, label in (("tokenize", "tokenize"), ("hashing", "hash blocks"),
                        ("decision", "policy decision")):
        mean = (after[name].sum - before[name].sum) / max(count, 1)
        median = f"≤ {bucket_quantile(before, after, name) * 1e6:.0f} µs"
        print(f"{label:>16}: median {median:>9}, mean "
              f"{mean * 1e6:6.1f} µs ({mean / per_request:6.1%})")
    print(f"\n# load average at the end: {os.getloadavg()[0]:.1f} (other work on the machine "
          "competes for the same CPUs)")


if __name__ == "__main__":
    main()
