"""Benchmark of the enginesim engine core: cost-model error and simulation speed.

    .venv/bin/python bench/bench_enginesim_core.py [--requests 560] [--skip-errors]

Table 1: the calibrated cost model against every calibration point (fit, hold-out,
cross-check rows; the constants stored in enginesim/engine/calibration.json).
Table 2: how fast the core simulates a replay-like workload (one instance's share of the
45-minute trace: 8,940 requests / 16 instances, mean input ~12k tokens with shared
prefixes, mean output 347), driven the way the discrete-event simulator drives it.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np

from enginesim.engine import EngineConfig, EngineCore, load_calibration
from enginesim.engine.calibrate import DEFAULT_CSV, all_points, error_table, format_table, summary


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    return f"{platform.node()} | {cpu} | {os.cpu_count()} cpus | Python {platform.python_version()}"


def workload(num_requests: int, duration: float, seed: int = 0) -> list[tuple]:
    rng = np.random.default_rng(seed)
    prefixes = [rng.integers(0, 150_000, 16_000) for _ in range(32)]
    arrivals, t = [], 0.0
    for i in range(num_requests):
        t += rng.exponential(duration / num_requests)
        prompt_len = int(np.clip(rng.lognormal(np.log(9000), 0.8), 64, 30_000))
        shared = prefixes[int(rng.integers(len(prefixes)))][: int(prompt_len * rng.uniform(0, 0.9))]
        prompt = np.concatenate([shared, rng.integers(0, 150_000, prompt_len - len(shared))])
        output = int(np.clip(rng.exponential(347), 1, 32_768 - prompt_len))
        arrivals.append((t, f"r{i}", prompt, output))
    return arrivals


def drive(engine: EngineCore, arrivals: list[tuple]) -> int:
    """Discrete-event loop: interleave arrivals with the engine's next events."""
    pending = list(arrivals)
    iterations = 0
    while True:
        next_engine = engine.next_event_time()
        if not pending and next_engine is None:
            return iterations
        iterations += 1
        if pending and (next_engine is None or pending[0][0] <= next_engine):
            t, req_id, prompt, max_tokens = pending.pop(0)
            engine.add_request(req_id, prompt, max_tokens, now=t)
        else:
            engine.advance_to(next_engine, events_only=True)


def speed_row(label: str, gpu: str, model: str, arrivals: list[tuple], **overrides) -> str:
    engine = EngineCore(EngineConfig.for_hardware(gpu, model, **overrides))
    start, cpu_start = time.perf_counter(), time.process_time()
    iterations = drive(engine, arrivals)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    s = engine.stats()
    simulated = s.prefix_cache_queries + s.generation_tokens
    hit = s.prefix_cache_hits / max(s.prefix_cache_queries, 1)
    return (f"| {label:<34} | {len(arrivals):>5} | {wall:6.2f} | {cpu:5.2f} | "
            f"{s.busy_time:7.0f} | {s.num_steps:>7} | {s.num_steps / cpu:>9.0f} | "
            f"{simulated / cpu / 1e6:>8.2f} | {s.generation_tokens / cpu / 1e3:>8.0f} | "
            f"{iterations:>6} | {hit:4.2f} | {s.num_preemptions:>5} |")


def speed_table(num_requests: int) -> None:
    duration = 2700.0
    base = workload(num_requests, duration)
    heavy = workload(3 * num_requests, duration, seed=1)
    small = workload(num_requests // 4, duration / 4, seed=2)
    print("| workload                           |  reqs | wall s | cpu s | sim s   |   steps "
          "|  steps/s | Mtok/s * | kgen/s   |  iters | hit  | preem |")
    print("|" + "|".join("-" * w for w in (36, 7, 8, 7, 9, 9, 10, 10, 10, 8, 6, 7)) + "|")
    print(speed_row("h20 qwen2-7b, 1/16 of trace", "h20", "qwen2-7b", base))
    print(speed_row("h20 qwen2-7b, 3x overloaded", "h20", "qwen2-7b", heavy))
    print(speed_row("h100 qwen3-30b-a3b, 1/16 of trace", "h100", "qwen3-30b-a3b", base))
    print(speed_row("h20 qwen2-7b, 1/4 KV (pressure)", "h20", "qwen2-7b", base,
                    num_gpu_blocks=20_000))
    fast = speed_row("1/4 of base, fast-forward", "h20", "qwen2-7b", small)
    print(fast)
    slow_engine = EngineCore(EngineConfig.for_hardware("h20", "qwen2-7b"), fast_forward=False)
    start, cpu_start = time.perf_counter(), time.process_time()
    drive(slow_engine, small)
    slow_wall, slow_cpu = time.perf_counter() - start, time.process_time() - cpu_start
    stats = slow_engine.stats()
    print(f"| {'1/4 of base, step by step':<34} | {len(small):>5} | {slow_wall:6.2f} | "
          f"{slow_cpu:5.2f} | {stats.busy_time:7.0f} | {stats.num_steps:>7} | "
          f"{stats.num_steps / slow_cpu:>9.0f} |          |          |        |      |       |")
    print("rates per CPU second of this process (the machine may be shared: see wall vs cpu)")
    print("* simulated tokens (prompt tokens queried + generated)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=560, help="requests per instance")
    parser.add_argument("--skip-errors", action="store_true")
    args = parser.parse_args()
    print(f"machine: {machine()}")
    cals = {era: load_calibration(era) for era in ("v1", "v0")}
    for era, c in cals.items():
        print(f"calibration {era}: {c}")
    if not args.skip_errors:
        print(f"\n## Cost model error per calibration point ({DEFAULT_CSV.name})\n")
        table = error_table(all_points(DEFAULT_CSV, None), cals)
        print(format_table(table))
        print(summary(table))
    print("\n## Core simulation speed (virtual time, single process)\n")
    speed_table(args.requests)


if __name__ == "__main__":
    main()
