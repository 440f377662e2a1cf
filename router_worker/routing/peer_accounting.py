"""Another router's requests, applied to this router's :class:`ClusterState` (replica sync).

Routers sharing a fleet each keep their own state and account their own requests through
:class:`~router_worker.routing.lifecycle.RequestLifecycle`. With replica sync each one also
applies what its *peers* report: a dispatch, a first token, an end. Those reports go
through the three functions here, the live router's :class:`router_worker.peers.PeerBook`
and the simulator (``enginesim.replay.simulator``) alike, so a peer's request weighs on
the view exactly as it would in either.

Pure (no I/O, no clock: ``now`` is passed in). Each function returns ``None`` when it
applied the report, else why it skipped it (the live router's metric label): a report
the state cannot take (an instance it does not know, another block size), a dispatch
already accounted (``duplicate``), a first token or end of a request it does not hold
(``unknown_id``: never accounted, already ended, or dropped). A peer's end is an
``on_finish`` whatever its outcome: its error, if any, is the peer's to count.
"""

from __future__ import annotations

from router_worker.routing.features import RequestFeatures
from router_worker.routing.indicators import ClusterState


def apply_peer_dispatch(
    state: ClusterState,
    features: RequestFeatures,
    instance: str,
    now: float,
    cached_tokens: int | None,
) -> str | None:
    """A peer sent ``features`` to ``instance`` (``cached_tokens``: its estimate, None:
    this state's own)."""
    if instance not in state.ids:
        return "unknown_instance"
    if features.block_size != state.block_size:
        return "block_size"
    if state.is_in_flight(features.request_id):
        return "duplicate"
    state.on_dispatch(features, instance, now, cached_tokens=cached_tokens)
    return None


def apply_peer_first_token(state: ClusterState, request_id: str, now: float) -> str | None:
    """A peer's request got its first token: its prefill is done, it decodes."""
    if not state.is_in_flight(request_id):
        return "unknown_id"
    state.on_first_token(request_id, now)
    return None


def apply_peer_end(state: ClusterState, request_id: str, now: float) -> str | None:
    """A peer's request ended (finished, failed, abandoned or moved): its load goes."""
    if not state.is_in_flight(request_id):
        return "unknown_id"
    state.on_finish(request_id, now)
    return None
