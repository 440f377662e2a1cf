"""The cold-path rows of the router overhead study (bench/router_overhead): the in-process hot
path (tokenize, hash, decide; ``router_cost.hot_path_costs``) warm, as a tight loop runs it,
and cold, with the CPU caches evicted before each request, as a host's other processes (the
engines' API servers, a load client, other tenants) evict them between two of a router's
requests.

Eviction: reading a buffer twice the size of the last-level cache (from sysfs; 32 MiB when
it does not say) before each request, outside the timings. The router's own stage times
under load (the side-by-side rows' ``intake`` and ``decide``) fall between the two columns,
which is why the warm figures understate what a live router spends. The last rows time one
call into numpy on a 2-element array and a pure-Python loop the same way: on small arrays,
numpy's cost is mostly its own code and tables, the first thing a neighbour evicts."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.lib.router_cost import hot_path_costs

SYSFS_CACHES = Path("/sys/devices/system/cpu/cpu0/cache")
FALLBACK_CACHE_BYTES = 32 << 20
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def last_level_cache_bytes(caches: Path = SYSFS_CACHES) -> int:
    """The size of the highest-level cache sysfs lists under ``caches`` (FALLBACK_CACHE_BYTES
    when it lists none, or none readable)."""
    best_level, best_size = 0, 0
    for index in caches.glob("index*"):
        try:
            level = int((index / "level").read_text())
            text = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        unit = _UNITS.get(text[-1:].upper(), 1)
        digits = text[:-1] if text[-1:].upper() in _UNITS else text
        if not digits.isdigit():
            continue
        if level > best_level:
            best_level, best_size = level, int(digits) * unit
    return best_size or FALLBACK_CACHE_BYTES


def evictor(size: int) -> Callable[[], object]:
    """A call that reads ``size`` bytes, pushing what the caches held out of them."""
    buffer = bytes(size)
    return lambda: buffer.count(b"\x01")


def _per_call_us(
    call: Callable[[], object], rounds: int, between: Callable[[], object] | None
) -> float:
    total = 0.0
    for _ in range(rounds):
        if between is not None:
            between()
        t0 = time.perf_counter()
        call()
        total += time.perf_counter() - t0
    return total / rounds * 1e6


def cold_path_rows() -> None:
    """Print the warm and cold hot path per policy and fleet size, then the primitives."""
    size = 2 * last_level_cache_bytes()
    evict = evictor(size)
    print(
        "\nHot path in-process, warm and with the caches evicted before each request "
        f"(a {size >> 20} MiB read), 400-char chat prompt (CPU µs per request)"
    )
    print(
        f"{'policy':>12} {'instances':>9} {'warm tok':>8} {'hash':>6} {'decide':>7} "
        f"{'cold tok':>8} {'hash':>6} {'decide':>7} {'cold/warm':>9}"
    )
    for policy in ("round_robin", "lmetric"):
        for instances in (2, 16):
            warm = hot_path_costs(policy, instances, 400, 2000)
            cold = hot_path_costs(policy, instances, 400, 200, evict)
            print(
                f"{policy:>12} {instances:>9} {warm[0]:>8.1f} {warm[1]:>6.1f} {warm[2]:>7.1f} "
                f"{cold[0]:>8.1f} {cold[1]:>6.1f} {cold[2]:>7.1f} {cold.sum() / warm.sum():>8.1f}×"
            )
    pair = np.ones(2)
    table = {k: k for k in range(100)}
    primitives: tuple[tuple[str, Callable[[], object]], ...] = (
        ("one numpy call on a 2-element array (np.maximum)", lambda: np.maximum(pair, 0.0)),
        ("a Python loop of 100 dict reads", lambda: sum(table[k] for k in range(100))),
    )
    for name, call in primitives:
        warm_us = _per_call_us(call, 2000, None)
        cold_us = _per_call_us(call, 200, evict)
        print(f"{name}: warm {warm_us:.1f} µs, cold {cold_us:.1f} µs")
