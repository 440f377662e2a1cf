"""Hand-built cluster states for routing tests."""

from __future__ import annotations

import itertools

import numpy as np

from router_worker.routing import BlockStored, ClusterState, Health, build_features
from router_worker.routing.features import RequestFeatures

_ids = itertools.count()


def tokens(start: int, count: int) -> np.ndarray:
    """A prompt of ``count`` distinct token ids beginning at ``start``."""
    return np.arange(start, start + count, dtype=np.int64)


def features(
    token_ids: np.ndarray,
    *,
    request_id: str | None = None,
    now: float = 0.0,
    session_key: str | None = None,
    turn_index: int | None = None,
    block_size: int = 16,
) -> RequestFeatures:
    return build_features(
        request_id or f"r{next(_ids)}",
        token_ids,
        now,
        block_size=block_size,
        session_key=session_key,
        turn_index=turn_index,
    )


def cluster(n: int, *, tps: float = 10_000.0, capacity_blocks: int = 10_000) -> ClusterState:
    state = ClusterState(default_prefill_tps=tps, default_capacity_blocks=capacity_blocks)
    for i in range(n):
        state.add_instance(f"i{i}")
    return state


def add_pending(state: ClusterState, instance_id: str, tokens_count: int) -> str:
    """Dispatch a request of ``tokens_count`` unique tokens that has not started."""
    start = 10_000_000 + next(_ids) * 100_000
    request = features(tokens(start, tokens_count))
    state.on_dispatch(request, instance_id, 0.0, cached_tokens=0)
    return request.request_id


def add_decoding(state: ClusterState, instance_id: str, count: int) -> list[str]:
    """``count`` one-token requests past their first token (adds to BS only)."""
    ids = []
    for _ in range(count):
        request = features(tokens(5_000_000 + next(_ids), 1))
        state.on_dispatch(request, instance_id, 0.0)
        state.on_first_token(request.request_id, 0.0)
        ids.append(request.request_id)
    return ids


def warm(state: ClusterState, instance_id: str, token_ids: np.ndarray) -> None:
    """Make ``instance_id`` hold the full blocks of ``token_ids`` (via a KV event)."""
    engine_hashes = tuple(
        f"{instance_id}-{next(_ids)}-{k}".encode()
        for k in range(len(token_ids) // state.block_size)
    )
    full = len(engine_hashes) * state.block_size
    event = BlockStored(
        engine_hashes, None, tuple(int(t) for t in token_ids[:full]), state.block_size
    )
    state.on_kv_event(instance_id, event, 0.0)


def set_health(state: ClusterState, instance_id: str, health: Health) -> None:
    state.set_health(instance_id, health)


def add_decoding_context(state: ClusterState, instance_id: str, count: int, context: int) -> None:
    """``count`` requests with ``context``-token prompts past their first token."""
    for _ in range(count):
        request = features(tokens(30_000_000 + next(_ids) * 1_000_000, context))
        state.on_dispatch(request, instance_id, 0.0, cached_tokens=context - 1)
        state.on_first_token(request.request_id, 0.0)
