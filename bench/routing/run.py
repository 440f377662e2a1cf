"""Routing-core benchmark: decision time per policy and block-hashing time.

Run: .venv/bin/python -m bench.routing.run [--requests 400]

Scenario per cluster size N (16, 128, 1024): 8192-token prompts made of a
4096-token shared system prefix + a per-request tail. The system prefix is
cached on a quarter of the instances and, for every request, one instance
already holds the first 7680 tokens (a follow-up turn), so the KV lookup walks
~480 of the prompt's 512 blocks: close to the worst case. Every instance has
pending prefill and a decode batch. Decision time = policy.decide(...) on
precomputed features (KV lookup + scoring + explanation); the state is not
mutated between requests. Dispatch time = ClusterState.on_dispatch of those
requests afterwards (accounting + KV shadow insert of 512 blocks, half of them
new to the index; cached_tokens passed in, as the router does, so no lookup),
round-robin over the instances. Hashing time =
features.hash_blocks on 8192 tokens.
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np

from engine_interface import percentile
from router_worker.routing import REGISTRY, BlockStored, ClusterState, build_features, make_policy
from router_worker.routing.features import hash_blocks

PROMPT = 8192
SYSTEM = 4096
SHARED_TURN = 7680


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def percentiles(samples_ns: list[int]) -> tuple[float, float]:
    values = np.array(samples_ns) / 1000.0
    return percentile(values, 50) or 0.0, percentile(values, 99) or 0.0


def warm(state: ClusterState, instance_id: str, token_ids: np.ndarray, tag: str) -> None:
    blocks = len(token_ids) // state.block_size
    engine_hashes = tuple(f"{tag}-{k}".encode() for k in range(blocks))
    event = BlockStored(engine_hashes, None, tuple(token_ids[: blocks * 16].tolist()), 16)
    state.on_kv_event(instance_id, event, 0.0)


def build_cluster(n: int, rng: np.random.Generator) -> tuple[ClusterState, list]:
    state = ClusterState(default_capacity_blocks=200_000)
    for i in range(n):
        state.add_instance(f"inst-{i}")
    system = rng.integers(0, 150_000, SYSTEM)
    for i in range(0, n, 4):
        warm(state, f"inst-{i}", system, f"sys{i}")
    for i in range(n):
        load = build_features(
            f"load-{i}", rng.integers(0, 150_000, int(rng.integers(16, 2048))), 0.0
        )
        state.on_dispatch(load, f"inst-{i}", 0.0)
        for b in range(int(rng.integers(0, 24))):
            busy = build_features(f"bs-{i}-{b}", [b, i], 0.0)
            state.on_dispatch(busy, f"inst-{i}", 0.0)
            state.on_first_token(busy.request_id, 0.0)
    return state, [system]


def make_requests(state: ClusterState, system: np.ndarray, count: int, rng) -> list:
    requests = []
    n = len(state.ids)
    for k in range(count):
        tail = rng.integers(0, 150_000, PROMPT - SYSTEM)
        prompt = np.concatenate([system, tail])
        warm(state, f"inst-{int(rng.integers(0, n))}", prompt[:SHARED_TURN], f"turn{k}")
        requests.append(build_features(f"req-{k}", prompt, float(k)))
    return requests


def time_policies(n: int, count: int, seed: int) -> list[tuple[str, int, float, float]]:
    rng = np.random.default_rng(seed)
    state, (system,) = build_cluster(n, rng)
    requests = make_requests(state, system, count, rng)
    view = state.view()
    rows = []
    for kind in REGISTRY:
        policy = make_policy(kind, {}, seed=seed)
        for request in requests[:20]:  # warm-up: ring construction, caches
            policy.decide(request, view, request.arrival_time)
        samples = []
        for request in requests:
            start = time.perf_counter_ns()
            policy.decide(request, view, request.arrival_time)
            samples.append(time.perf_counter_ns() - start)
        rows.append((kind, n, *percentiles(samples)))
    samples = []
    for k, request in enumerate(requests):
        start = time.perf_counter_ns()
        state.on_dispatch(request, state.ids[k % n], request.arrival_time, cached_tokens=0)
        samples.append(time.perf_counter_ns() - start)
    rows.append(("(dispatch)", n, *percentiles(samples)))
    return rows


def time_hashing(count: int) -> list[tuple[str, float, float]]:
    rng = np.random.default_rng(0)
    rows = []
    arrays = [rng.integers(0, 150_000, PROMPT) for _ in range(count)]
    lists = [a.tolist() for a in arrays]
    for label, inputs in (("numpy int64 array", arrays), ("Python list", lists)):
        samples = []
        for tokens in inputs:
            start = time.perf_counter_ns()
            hash_blocks(tokens)
            samples.append(time.perf_counter_ns() - start)
        rows.append((label, *percentiles(samples)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--sizes", default="16,128,1024")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    print(
        f"machine: {cpu_model()}, {platform.machine()}, Python {platform.python_version()}, "
        f"numpy {np.__version__}"
    )
    print(
        f"settings: prompt {PROMPT} tokens (block 16), shared prefix {SYSTEM} on 1/4 of "
        f"instances, one instance holding {SHARED_TURN}; {args.requests} timed decisions "
        f"per cell, default params\n"
    )
    print(f"{'policy':<12} {'instances':>9} {'p50 µs':>9} {'p99 µs':>9}")
    for n in (int(s) for s in args.sizes.split(",")):
        for kind, size, p50, p99 in time_policies(n, args.requests, args.seed):
            print(f"{kind:<12} {size:>9} {p50:>9.1f} {p99:>9.1f}")
    print(f"\n{'hashing 8192 tokens':<24} {'p50 µs':>9} {'p99 µs':>9}")
    for label, p50, p99 in time_hashing(args.requests):
        print(f"{label:<24} {p50:>9.1f} {p99:>9.1f}")


if __name__ == "__main__":
    main()
