"""The cost rows of the router overhead study (bench/router_overhead): non-streamed throughput
through the router against enginesim direct, process CPU per request and per SSE chunk, the
in-process hot path (tokenize, hash, decide), a traffic capture's cost, and the upstream
connection pool's rate as open connections grow."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np

from bench.lib.cpu import cpu_seconds
from bench.lib.loadclient import Run, closed_loop, run_async, run_loop
from bench.lib.processes import REPO, BenchStack
from bench.lib.stats import bucket_quantile, router_histograms
from devharness import free_port, start_process, stop_process, wait_http


def hot_path_costs(
    policy_kind: str,
    instances: int,
    chars: int,
    rounds: int,
    between: Callable[[], object] | None = None,
) -> np.ndarray:
    """Mean CPU µs per request of (tokenize, hash, decide), in-process: a chat request with
    a ``chars``-long shared system prompt, routed by ``policy_kind`` over ``instances``
    with a warm KV index, after ``rounds`` // 10 untimed requests of warm-up; ``between`` runs
    before each request, outside the timings."""
    from router_worker.routing import ClusterState, build_features, make_policy
    from router_worker.tokenization import Tokenizer

    tokenizer = Tokenizer()
    state = ClusterState(block_size=16)
    for k in range(instances):
        state.add_instance(f"i{k}")
    policy = make_policy(policy_kind, {}, 0)
    view = state.view()
    shared = "system prompt " * (chars // 28)
    timings = np.zeros(3)
    warmup = rounds // 10
    for n in range(-warmup, rounds):
        if between is not None:
            between()
        t0 = time.process_time()
        ids, _ = tokenizer.encode_chat(
            [{"role": "system", "content": shared}, {"role": "user", "content": f"question {n}"}]
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
        if n >= 0:
            timings += (t1 - t0, t2 - t1, t3 - t2)
    return timings / rounds * 1e6


def hot_path_rows() -> None:
    """Tokenize + hash + decide in-process (CPU time, no network): the stable figure."""
    from router_worker.routing.features import hash_blocks

    print(
        "\nHot path in-process, lmetric over 16 instances with a warm KV index (CPU µs per request)"
    )
    print(f"{'prompt chars':>12} {'tokenize':>9} {'hash':>7} {'decide':>7} {'total':>7}")
    for chars in (400, 4000, 32000):
        tok, hashing, decide = hot_path_costs("lmetric", 16, chars, 2000)
        print(
            f"{chars:>12} {tok:>9.1f} {hashing:>7.1f} {decide:>7.1f} {tok + hashing + decide:>7.1f}"
        )
    ids_list = list(range(8192))
    ids_array = np.array(ids_list, dtype=np.int64)
    for name, ids_in in (("an array", ids_array), ("a Python list", ids_list)):
        t0 = time.process_time()
        for _ in range(500):
            hash_blocks(ids_in, 16)
        print(
            f"block hashes of 8192 tokens from {name}: {(time.process_time() - t0) * 2000:.1f} µs"
        )


def capture_rows() -> None:
    """What a traffic capture costs per request (router_worker/capture.py): on the router's
    request path (the append when ``Plan.finish`` closes a request: the ``RequestSamples``
    observer, router_worker/observers.py), in its telemetry writer (packing the
    block hashes, the session digest, the batch's JSON) and at the control plane's ingest
    (the keyed digests of the block hashes), for prompts sharing a system prompt (the
    shared blocks' digests come from the cache) and for unique ones."""
    from router_worker.capture import CaptureBuffer
    from router_worker.contract.capture import CaptureKey
    from router_worker.contract.config import CaptureSpec
    from router_worker.routing import build_features

    print("\nTraffic capture, in-process (CPU µs per request)")
    print(f"{'prompt tokens':>13} {'prompts':>8} {'request path':>13} {'writer':>7} {'ingest':>7}")
    spec = CaptureSpec(id=1, salt="s" * 32)
    rng = np.random.default_rng(0)
    for tokens in (100, 1000, 8000):
        for shared in (True, False):
            prefix = rng.integers(0, 150_000, tokens - 16)
            buffer, key, rounds = CaptureBuffer(), CaptureKey(spec.salt), 2000
            features = []
            for n in range(rounds):
                head = prefix if shared else rng.integers(0, 150_000, tokens - 16)
                ids = np.concatenate([head, rng.integers(0, 150_000, 16)])
                features.append(build_features(f"r{n}", ids, n * 0.01, session_key=f"u{n % 50}"))
            t0 = time.process_time()
            for f in features:
                buffer.add(
                    spec,
                    f,
                    output_tokens=100,
                    instance="i0",
                    arm="default",
                    status=200,
                    ttft_s=0.2,
                    tpot_s=0.02,
                )
            t1 = time.process_time()
            for batch in buffer.drain("c", "r0"):  # batches of CAPTURE_BATCH, as written
                batch.model_dump_json()
            t2 = time.process_time()
            for f in features:
                key.block_ids(f.block_hashes)
            t3 = time.process_time()
            path, writer, ingest = (
                (b - a) / rounds * 1e6 for a, b in ((t0, t1), (t1, t2), (t2, t3))
            )
            kind = "shared" if shared else "unique"
            print(f"{tokens:>13} {kind:>8} {path:>13.2f} {writer:>7.1f} {ingest:>7.1f}")


def measure_cpu(
    ports: list[int], pid: int, concurrency: int, duration: float, stream: bool, max_tokens: int
) -> tuple[Run, float]:
    """A closed-loop run and the CPU seconds process ``pid`` spent during it."""
    cpu0 = cpu_seconds(pid)
    run = run_async(run_loop(ports, concurrency, duration, stream, max_tokens))
    return run, cpu_seconds(pid) - cpu0


def cpu_rows(setup: BenchStack, args: argparse.Namespace) -> None:
    """CPU time per request and per streamed chunk: the robust figure on a shared machine.

    Per chunk: the slope between streams of ``SHORT`` and ``LONG`` tokens (CPU per request
    against SSE events per request), so the fixed per-request part drops out; per stream:
    the intercept. Router rows: the router process only (enginesim's CPU is not in them);
    direct rows: the enginesim process serving the same requests without the router.
    """
    ports, engines, router = setup.ports, setup.fleet.process, setup.routers["lmetric"].process
    router_port = setup.routers["lmetric"].port
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


def throughput_rows(setup: BenchStack, args: argparse.Namespace) -> None:
    ports, engines, router = setup.ports, setup.fleet.process, setup.routers["lmetric"].process
    router_port = setup.routers["lmetric"].port
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


async def trivial_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The upstream of :func:`upstream_pool_rows`: ``/hold?s=N`` answers after N seconds
    (a stream held open), anything else at once."""
    if scope["type"] != "http":
        return
    if scope["path"] == "/hold":
        await asyncio.sleep(float(scope["query_string"].decode().partition("=")[2] or 0))
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def upstream_pool_rows(duration: float) -> None:
    """Requests per second one client gets, one at a time, while it holds N − 1 other
    connections open: httpx's default transport (httpcore's pool) against FastTransport."""
    from router_worker.upstream import FastTransport

    port = free_port()
    server = start_process(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "bench.lib.router_cost:trivial_app",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        cwd=REPO,
    )
    url = f"http://127.0.0.1:{port}"
    transports: dict[str, Callable[[], httpx.AsyncBaseTransport]] = {
        "httpx default": lambda: httpx.AsyncHTTPTransport(
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=None)
        ),
        "FastTransport": FastTransport,
    }

    async def rate(transport: httpx.AsyncBaseTransport, held: int) -> float:
        async with httpx.AsyncClient(transport=transport, timeout=duration + 30) as client:
            holds = [
                asyncio.create_task(client.get(f"{url}/hold?s={duration + 5}")) for _ in range(held)
            ]
            await asyncio.sleep(1.0)  # the held connections open first
            count, end = 0, time.perf_counter() + duration
            while time.perf_counter() < end:
                await client.get(url + "/")
                count += 1
            for task in holds:
                task.cancel()
            await asyncio.gather(*holds, return_exceptions=True)
        return count / duration

    try:
        wait_http(url + "/", 30, process=server)
        print(
            "\nUpstream pool: requests/s one at a time beside N − 1 held connections "
            f"({duration:g} s each)"
        )
        print(f"{'connections':>11} " + " ".join(f"{name:>14}" for name in transports))
        for connections in (1, 32, 200):
            rates = [asyncio.run(rate(make(), connections - 1)) for make in transports.values()]
            print(f"{connections:>11} " + " ".join(f"{r:>14.0f}" for r in rates))
    finally:
        stop_process(server)
