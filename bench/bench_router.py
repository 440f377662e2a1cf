"""What the router adds: TTFT at 1/50/200 concurrent streams and requests/s, vs enginesim direct.

Processes: one ``python -m enginesim serve`` (4 instances), two ``python -m router_worker``
in front of it (lmetric; round_robin for the added-TTFT rows, whose placement matches the
client's direct round robin, one rotation shared by all its workers), and this load
generator (raw asyncio sockets parsed with httptools, so the client stays cheap; one
keep-alive connection per worker and port). TTFT is measured by the client, from sending
the request to the first SSE line carrying a token; "added" = router − direct for the same
percentile. Beside it, the router's own view of what it adds, free of the client's and the
engine's share of the CPUs: its ``switchyard_router_overhead_seconds`` histogram (arrival to
the upstream request, plus the first chunk's relay to the client), per row, as bucket upper
bounds, with the event loop's lag (how late a 10 ms timer fires: what the request's
bytes wait in the socket before the handler starts, which the histogram cannot see), and
the share of the time the router was runnable but had no CPU. For the TTFT rows the
processes are pinned (``--placement``): by default the engines get CPU 0 to themselves in
both arms and the client shares the other CPU with the routers, so the engines' work is the
same in both arms and the router's CPU cost shows up at the client (conservative).
``router-apart`` gives the routers a CPU of their own (as deployed; but then the routed arm
has more CPU for the engines and client than the direct arm), ``shared`` pins nothing (the
router's p99 is then mostly its wait for a CPU).
Throughput: closed-loop non-streamed requests (``max_tokens`` 4) at 64 in
flight. Time shares: the router's own histograms (tokenize, hash, decide) against the
router process's CPU time per request. On a 2-core machine the three processes share
the CPUs: the numbers include that contention, and the CPU columns show it.

CPU cost (the figure that stays comparable on a shared machine): process CPU time
(``/proc/<pid>/stat`` utime+stime) of the router and of enginesim serving the same load
directly, per non-streamed request, per stream (intercept) and per SSE chunk (slope between
4- and 64-token streams), at 32 in flight.

    .venv/bin/python bench/bench_router.py [--duration 6] [--time-scale 0.05] [--only cpu]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import platform
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httptools
import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
TICKS = os.sysconf("SC_CLK_TCK")
INSTANCES = 4
MODEL = "Qwen/Qwen2-7B-Instruct"


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


def start_processes(time_scale: float, workdir: Path) -> tuple[list[int], list[int], list[Any]]:
    """enginesim, then two routers in front of it: lmetric and round_robin."""
    base = free_base_port(INSTANCES)
    engines = subprocess.Popen(
        [sys.executable, "-m", "enginesim", "serve", "--instances", str(INSTANCES),
         "--base-port", str(base), "--time-scale", str(time_scale)],
        cwd=REPO, stdout=subprocess.DEVNULL)
    ports = [base + k for k in range(INSTANCES)]
    for port in ports:
        wait_http(f"http://127.0.0.1:{port}/health", engines)
    routers = [start_router(ports, policy, workdir) for policy in ("lmetric", "round_robin")]
    return ports, [port for port, _ in routers], [engines, *(proc for _, proc in routers)]


def start_router(ports: list[int], policy: str, workdir: Path) -> tuple[int, Any]:
    config = {"model": MODEL, "policy": {"kind": policy, "params": {}},
              "instances": [{"name": f"i{k}", "url": f"http://127.0.0.1:{p}"}
                            for k, p in enumerate(ports)],
              "router": {"max_concurrency": 4096}}
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

    def __init__(self, start: float) -> None:
        self.start = start
        self.first: float | None = None
        self.events = 0
        self.pending = b""
        self.complete = False
        self.keep_alive = False
        self.parser: httptools.HttpResponseParser | None = None

    def on_headers_complete(self) -> None:
        # Read now: llhttp resets its flags once the message completes.
        assert self.parser is not None
        self.keep_alive = self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        lines = (self.pending + body).split(b"\n")
        self.pending = lines.pop()
        for line in lines:
            if line.startswith(b"data: "):
                self.events += 1
                if self.first is None and b'"text":"' in line:
                    self.first = time.perf_counter() - self.start

    def on_message_complete(self) -> None:
        self.complete = True


class Client:
    """One keep-alive connection per engine or router port, as a production client (or
    the router towards the engines) keeps: accepting a connection per request in an
    already busy enginesim would be measured as engine latency."""

    def __init__(self) -> None:
        self.connections: dict[int, tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}

    async def request(self, port: int, body: bytes, stream: bool) -> tuple[float | None, int]:
        """Client-side TTFT (streams) or latency (non-stream) of one request, seconds, and
        the number of SSE data events received (0 for non-streamed answers)."""
        start = time.perf_counter()
        if port not in self.connections:
            self.connections[port] = await asyncio.open_connection("127.0.0.1", port)
        reader, writer = self.connections[port]
        exchange = _Exchange(start)
        parser = exchange.parser = httptools.HttpResponseParser(exchange)
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                     % len(body) + body)
        try:
            while not exchange.complete:
                data = await reader.read(65536)
                if not data:
                    raise ConnectionError("closed by the server")
                parser.feed_data(data)
        except (ConnectionError, httptools.HttpParserError):
            self.drop(port)
            return None, 0
        if not exchange.keep_alive:
            self.drop(port)
        if parser.get_status_code() != 200:
            return None, 0
        if not stream:
            return time.perf_counter() - start, 0
        return exchange.first, exchange.events

    def drop(self, port: int) -> None:
        _, writer = self.connections.pop(port)
        writer.close()

    def close(self) -> None:
        for port in list(self.connections):
            self.drop(port)


class Run:
    """One closed-loop run: client-side samples, failures, wall time and SSE events."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self.failures = 0
        self.events = 0
        self.elapsed = 0.0


async def run_loop(ports: list[int], concurrency: int, duration: float, stream: bool,
                   max_tokens: int) -> Run:
    run = Run()
    deadline = time.perf_counter() + duration
    # A fresh prefix per run: a prompt repeated from an earlier run would hit the engines'
    # prefix cache and make whichever path runs later look faster.
    nonce = time.perf_counter_ns()
    # One round robin over the ports shared by all workers, like the router's: a per-worker
    # rotation leaves some engines with more streams than others at any moment, which on a
    # prefill-bound engine doubled direct TTFT and made the router look faster than direct.
    turns = itertools.count()

    async def worker(n: int) -> None:
        k = 0
        client = Client()
        while time.perf_counter() < deadline:
            prompt = f"run {nonce} client {n} request {k} " + "lorem ipsum dolor sit amet " * 12
            body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens,
                               "stream": stream}).encode()
            value, events = await client.request(ports[next(turns) % len(ports)], body, stream)
            if value is None:
                run.failures += 1
            else:
                run.samples.append(value)
                run.events += events
            k += 1
        client.close()

    start = time.perf_counter()
    await asyncio.gather(*(worker(n) for n in range(concurrency)))
    run.elapsed = time.perf_counter() - start
    return run


async def closed_loop(ports: list[int], concurrency: int, duration: float, stream: bool,
                      max_tokens: int) -> tuple[list[float], int, float]:
    run = await run_loop(ports, concurrency, duration, stream, max_tokens)
    return run.samples, run.failures, run.elapsed


def router_histograms(port: int) -> dict[str, float]:
    """Sums, counts and cumulative buckets of the router's hot-path histograms."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    out: dict[str, float] = {}
    for name in ("tokenize", "hashing", "decision", "overhead", "loop_lag"):
        for suffix in ("sum", "count"):
            pattern = rf"^switchyard_router_{name}_seconds_{suffix}(?:{{[^}}]*}})? (\S+)$"
            out[f"{name}_{suffix}"] = sum(float(v) for v in re.findall(pattern, text, re.M))
        bucket = rf'^switchyard_router_{name}_seconds_bucket{{[^}}]*le="([^"]+)"[^}}]*}} (\S+)$'
        for le, value in re.findall(bucket, text, re.M):
            key = f"{name}_le_{le}"
            out[key] = out.get(key, 0.0) + float(value)
    return out


def bucket_quantile(before: dict[str, float], after: dict[str, float], name: str,
                    q: float = 0.5) -> float:
    """Upper bound (s) of the bucket holding quantile ``q`` of the observations between
    two scrapes (inf when it lies beyond the last bucket, nan without observations)."""
    prefix = f"{name}_le_"
    bounds = sorted((float(k[len(prefix):]), k) for k in after if k.startswith(prefix))
    total = after[f"{name}_count"] - before.get(f"{name}_count", 0.0)
    if total <= 0:
        return float("nan")
    for bound, key in bounds:
        if after[key] - before.get(key, 0.0) >= q * total:
            return bound
    return float("inf")


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1000 if values else float("nan")


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
    run = asyncio.run(run_loop(ports, concurrency, duration, stream, max_tokens))
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
    parser.add_argument("--duration", type=float, default=6.0)
    parser.add_argument("--time-scale", type=float, default=0.05)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--only", choices=("ttft", "throughput", "cpu", "hot-path"),
                        action="append", help="run only these sections (repeatable)")
    parser.add_argument("--placement", choices=sorted(PLACEMENTS), default="engines-apart",
                        help="CPU pinning for the TTFT rows (throughput and CPU rows: shared)")
    args = parser.parse_args()
    sections = set(args.only or ("ttft", "throughput", "cpu", "hot-path"))
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    print(f"# router overhead vs enginesim direct ({machine})")
    print(f"# load average at start: {os.getloadavg()[0]:.1f}")
    print(f"# {INSTANCES} enginesim instances h20/qwen2-7b, time scale {args.time_scale}; "
          f"router lmetric, approx tokenizer; {args.duration}s closed loop per row")
    with tempfile.TemporaryDirectory() as tmp:
        ports, (router_port, rr_port), procs = start_processes(args.time_scale, Path(tmp))
        engines, router, rr_router = procs
        try:
            asyncio.run(closed_loop([router_port], 8, 1.0, True, 4))  # warm-up
            if "ttft" in sections:
                with placed(args.placement, engines, [router, rr_router]) as placement:
                    print(f"\n# TTFT rows: {placement}")
                    ttft_rows(ports, router_port, rr_port, rr_router, args)
            if "throughput" in sections:
                throughput_rows(ports, router_port, router, engines, args)
            if "cpu" in sections:
                cpu_rows(ports, router_port, router, engines, args)
            if "hot-path" in sections:
                hot_path_rows()
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(timeout=10)


def ttft_rows(ports: list[int], router_port: int, rr_port: int,
              rr_router: subprocess.Popen[bytes], args: argparse.Namespace) -> None:
    """Added TTFT: the round-robin router against the client's own round robin over the
    engines (the same placement, so the difference is the router's cost), then lmetric
    (its placement differs: on a prefill-bound engine it can beat the client's round robin,
    so its difference to direct is not an overhead)."""
    print(f"\nTTFT, streams of max_tokens={args.max_tokens} (ms); added = round-robin router "
          "− direct round robin; router-side = the router's own histogram of its time in the "
          "first chunk (arrival → upstream request, engine's first chunk → client) and its "
          "event-loop lag (what a readable socket waits before it is read), bucket upper "
          "bounds")
    header = (f"{'streams':>7} {'direct p50':>10} {'p99':>7} {'router p50':>10} {'p99':>7} "
              f"{'added p50':>9} {'added p99':>9} {'router-side p50':>15} {'p99':>6} "
              f"{'loop lag p50':>12} {'p99':>6} {'CPU wait':>8} "
              f"{'requests':>8} {'router CPU':>10} {'lmetric p50':>11} {'p99':>7}")
    print(header)
    print("-" * len(header))
    for concurrency in (1, 50, 200):
        direct, fail_d, _ = asyncio.run(closed_loop(ports, concurrency, args.duration, True,
                                                    args.max_tokens))
        cpu0, before = cpu_seconds(rr_router.pid), router_histograms(rr_port)
        wait0 = runnable_wait_seconds(rr_router.pid)
        routed, fail_r, elapsed = asyncio.run(closed_loop([rr_port], concurrency,
                                                          args.duration, True, args.max_tokens))
        cpu = (cpu_seconds(rr_router.pid) - cpu0) / elapsed
        wait = (runnable_wait_seconds(rr_router.pid) - wait0) / elapsed
        after = router_histograms(rr_port)
        side = [bucket_quantile(before, after, name, q) * 1000
                for name in ("overhead", "loop_lag") for q in (0.5, 0.99)]
        lmetric, fail_l, _ = asyncio.run(closed_loop([router_port], concurrency, args.duration,
                                                     True, args.max_tokens))
        failures = fail_d + fail_r + fail_l
        print(f"{concurrency:>7} {pct(direct, 50):>10.2f} {pct(direct, 99):>7.2f} "
              f"{pct(routed, 50):>10.2f} {pct(routed, 99):>7.2f} "
              f"{pct(routed, 50) - pct(direct, 50):>9.2f} "
              f"{pct(routed, 99) - pct(direct, 99):>9.2f} {'≤ ' + format(side[0], 'g'):>15} "
              f"{'≤ ' + format(side[1], 'g'):>6} {'≤ ' + format(side[2], 'g'):>12} "
              f"{'≤ ' + format(side[3], 'g'):>6} {wait:>8.0%} {len(routed):>8} {cpu:>10.0%} "
              f"{pct(lmetric, 50):>11.2f} {pct(lmetric, 99):>7.2f}"
              + (f"  failures direct/rr/lmetric={fail_d}/{fail_r}/{fail_l}" if failures else ""),
              flush=True)


def throughput_rows(ports: list[int], router_port: int, router: subprocess.Popen[bytes],
                    engines: subprocess.Popen[bytes], args: argparse.Namespace) -> None:
    concurrency = 64
    engine0 = cpu_seconds(engines.pid)
    direct, _, elapsed_d = asyncio.run(closed_loop(ports, concurrency, args.duration, False, 4))
    engine_per_request = (cpu_seconds(engines.pid) - engine0) / max(len(direct), 1)
    before = router_histograms(router_port)
    cpu0 = cpu_seconds(router.pid)
    routed, _, elapsed_r = asyncio.run(closed_loop([router_port], concurrency, args.duration,
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
    count = after["decision_count"] - before["decision_count"]
    print("\nRouter hot path per request (its own histograms, wall clock): median bucket, "
          "mean, and the mean's share of the router's CPU time per request")
    for name, label in (("tokenize", "tokenize"), ("hashing", "hash blocks"),
                        ("decision", "policy decision")):
        mean = (after[f"{name}_sum"] - before[f"{name}_sum"]) / max(count, 1)
        median = f"≤ {bucket_quantile(before, after, name) * 1e6:.0f} µs"
        print(f"{label:>16}: median {median:>9}, mean "
              f"{mean * 1e6:6.1f} µs ({mean / per_request:6.1%})")
    print(f"\n# load average at the end: {os.getloadavg()[0]:.1f} (other work on the machine "
          "competes for the same CPUs)")


if __name__ == "__main__":
    main()
