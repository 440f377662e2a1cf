"""Another router's requests applied to a ClusterState (routing/peer_accounting): a peer's
request weighs on the view exactly as the same request of our own, and reports the state
cannot take are skipped with their reason, leaving it untouched."""

from __future__ import annotations

import numpy as np
import pytest

from router_worker.routing import ClusterState, RequestLifecycle
from router_worker.routing.peer_accounting import (
    apply_peer_dispatch,
    apply_peer_end,
    apply_peer_first_token,
)
from router_worker.routing.policies.round_robin import RoundRobinPolicy
from tests.routing.helpers import cluster, features, tokens

ARRAYS = ("pending", "in_flight", "decoding", "context", "decode_blocks", "tps")


def snapshot(state: ClusterState) -> dict[str, list[float]]:
    view = state.view()
    probe = features(tokens(7_000, 256))
    return {
        **{name: np.asarray(getattr(state, name)).tolist() for name in ARRAYS},
        "cached": view.cached_blocks(probe).tolist(),
        "in_flight_ids": sorted(state._requests),
    }


def test_a_peers_request_weighs_on_the_view_as_our_own() -> None:
    ours, theirs = cluster(3), cluster(3)
    request = features(tokens(7_000, 200), request_id="ra/1")
    life = RequestLifecycle(request, RoundRobinPolicy(seed=0), ours)
    attempt = life.route(ours.view(), 1.0)
    assert attempt.decision is not None
    life.dispatch(1.0)
    cached = attempt.decision.cached_tokens
    assert apply_peer_dispatch(theirs, request, attempt.instance, 1.0, cached) is None
    assert snapshot(ours) == snapshot(theirs)
    life.first_token(1.4, ttft=0.4)
    assert apply_peer_first_token(theirs, "ra/1", 1.4) is None
    assert snapshot(ours) == snapshot(theirs)
    life.finish(2.0, output_tokens=5)
    assert apply_peer_end(theirs, "ra/1", 2.0) is None
    assert snapshot(ours) == snapshot(theirs)
    assert theirs.in_flight.sum() == 0 and theirs.error_count == 0


def test_a_peer_dispatch_without_an_estimate_uses_this_states_cache() -> None:
    state = cluster(2)
    warm = features(tokens(0, 64), request_id="ra/warm")
    assert apply_peer_dispatch(state, warm, "i1", 1.0, None) is None  # i1 now holds 4 blocks
    again = features(tokens(0, 80), request_id="ra/again")
    assert apply_peer_dispatch(state, again, "i1", 1.1, None) is None
    assert state.pending[state.slot_of("i1")] == 64 + 16  # 64 cached of 80


@pytest.mark.parametrize(
    "instance, block_size, reason",
    [("i9", 16, "unknown_instance"), ("i0", 32, "block_size")],
)
def test_a_dispatch_the_state_cannot_take_is_skipped(
    instance: str, block_size: int, reason: str
) -> None:
    state = cluster(2)
    before = snapshot(state)
    request = features(tokens(0, 64), request_id="ra/x", block_size=block_size)
    assert apply_peer_dispatch(state, request, instance, 1.0, 0) == reason
    assert snapshot(state) == before


def test_repeated_and_unknown_reports_are_skipped() -> None:
    state = cluster(2)
    request = features(tokens(0, 64), request_id="ra/1")
    assert apply_peer_dispatch(state, request, "i0", 1.0, 0) is None
    held = snapshot(state)
    assert apply_peer_dispatch(state, request, "i1", 1.1, 0) == "duplicate"
    assert apply_peer_first_token(state, "ra/2", 1.2) == "unknown_id"
    assert apply_peer_end(state, "ra/2", 1.2) == "unknown_id"
    assert snapshot(state) == held
    assert apply_peer_end(state, "ra/1", 1.3) is None
    ended = snapshot(state)
    assert apply_peer_end(state, "ra/1", 1.4) == "unknown_id"  # ended once only
    assert apply_peer_first_token(state, "ra/1", 1.4) == "unknown_id"  # a late report
    assert snapshot(state) == ended and state.error_count == 0
