"""SSE tokens per second that one enginesim process (a devharness.Fleet) sustains on one core.

The server runs pinned to CPU 0, the load generator to CPU 1 (raw asyncio
sockets, so the client stays cheap). The simulated GPU runs far faster than
real time (``--time-scale 0.001``) so the HTTP/SSE path, not the simulated
hardware, is the limit; the last rows run in real time (scale 1). Each row:
closed-loop streams of ``/v1/completions`` with ``max_tokens`` tokens each,
measured over a fixed window after a warm-up.
``tok/CPU-s`` (tokens per second of server CPU) is the capacity of one fully
used core; it is the stable figure on a shared machine where the raw rate
depends on what else runs.

    .venv/bin/python -m bench.enginesim_server.run [--duration 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

from devharness import Fleet, free_ports

TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Case:
    instances: int
    concurrency: int
    stream_interval: int
    time_scale: float = 0.001
    max_tokens: int = 256


CASES = [
    Case(1, 16, 1),
    Case(1, 64, 1),
    Case(1, 256, 1),
    Case(16, 64, 1),
    Case(16, 256, 1),
    Case(1, 64, 4),
    Case(16, 256, 4),
    # Real time (time scale 1): the simulated H20s set the token rate; the CPU
    # column says how much of one core a 16-instance cluster needs.
    Case(16, 256, 1, time_scale=1.0),
    Case(16, 1024, 1, time_scale=1.0),
]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def start_server(case: Case, base: int) -> Fleet:
    """``case``'s fleet on ports from ``base``, pinned to CPU 0, every instance healthy."""
    return Fleet(
        case.instances,
        base_port=base,
        time_scale=case.time_scale,
        extra=["--stream-interval", str(case.stream_interval)],
        prefix=["taskset", "-c", "0"],
    ).start()


class Counter:
    def __init__(self) -> None:
        self.chunks = 0
        self.requests = 0


async def stream_once(port: int, body: bytes, counter: Counter) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    writer.write(head.encode() + body)
    await reader.readuntil(b"\r\n\r\n")
    while line := await reader.readline():
        if line.startswith(b"data: {"):
            counter.chunks += 1
        elif line.startswith(b"data: [DONE]"):
            break
    counter.requests += 1
    writer.close()


async def client_loop(port: int, case: Case, counter: Counter, stop: asyncio.Event, n: int):
    body = json.dumps(
        {"prompt": f"benchmark stream {n} " * 8, "max_tokens": case.max_tokens, "stream": True}
    ).encode()
    while not stop.is_set():
        await stream_once(port, body, counter)


async def run_load(case: Case, base: int, warmup: float, duration: float) -> tuple[int, float]:
    counter, stop = Counter(), asyncio.Event()
    tasks = [
        asyncio.ensure_future(client_loop(base + n % case.instances, case, counter, stop, n))
        for n in range(case.concurrency)
    ]
    await asyncio.sleep(warmup)
    start_chunks, start = counter.chunks, time.monotonic()
    await asyncio.sleep(duration)
    chunks, elapsed = counter.chunks - start_chunks, time.monotonic() - start
    stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return chunks, elapsed


def measure(case: Case, warmup: float, duration: float) -> dict[str, float]:
    base = free_ports(case.instances)
    with start_server(case, base) as fleet:
        pid = fleet.process.pid

        async def timed() -> tuple[int, float, float, float]:
            load = asyncio.ensure_future(run_load(case, base, warmup, duration))
            await asyncio.sleep(warmup)
            server_before, client_before = cpu_seconds(pid), cpu_seconds(os.getpid())
            chunks, elapsed = await load
            server = cpu_seconds(pid) - server_before
            return chunks, elapsed, server, cpu_seconds(os.getpid()) - client_before

        chunks, elapsed, server_cpu, client_cpu = asyncio.run(timed())
    tokens = chunks * case.stream_interval
    return {
        "chunks_per_s": chunks / elapsed,
        "tokens_per_s": tokens / elapsed,
        "server_cpu": server_cpu / elapsed,
        "client_cpu": client_cpu / elapsed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    args = parser.parse_args()
    os.sched_setaffinity(0, {1})
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    print(f"# enginesim SSE throughput, server pinned to CPU 0, client to CPU 1 ({machine})")
    print(f"# h20/qwen2-7b, window {args.duration}s after {args.warmup}s warm-up, "
          "completions max_tokens=256")  # fmt: skip
    header = (
        f"{'scale':>6} {'instances':>9} {'streams':>7} {'interval':>8} {'SSE chunks/s':>12} "
        f"{'tokens/s':>9} {'server CPU':>10} {'client CPU':>10} {'tok/CPU-s':>9}"
    )
    print(header)
    print("-" * len(header))
    for case in CASES:
        row = measure(case, args.warmup, args.duration)
        per_core = row["tokens_per_s"] / max(row["server_cpu"], 1e-9)
        print(f"{case.time_scale:>6g} {case.instances:>9} {case.concurrency:>7} "
              f"{case.stream_interval:>8} {row['chunks_per_s']:>12.0f} {row['tokens_per_s']:>9.0f} "
              f"{row['server_cpu']:>10.0%} {row['client_cpu']:>10.0%} "
              f"{per_core:>9.0f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
