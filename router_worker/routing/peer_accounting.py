"""Another router's requests, applied to this router's :class:`ClusterState` (replica sync).

Routers sharing a fleet each keep their own state and account their own requests through
:class:`~router_worker.routing.lifecycle.RequestLifecycle`. With replica sync each one also
tells its peers of its own requests (:class:`PeerReports`, an observer of the lifecycle)
and applies what its *peers* report: a dispatch, a first token, an end. Both sides are
here, used by the live router (:mod:`router_worker.peers` carries the reports) and the
simulator (``enginesim.replay.simulator`` delays them by its sync hop) alike, so a peer's
request is reported and weighs on the view exactly as it would in either.

Pure (no I/O, no clock: ``now`` is passed in). Each function returns ``None`` when it
applied the report, else why it skipped it (the live router's metric label): a report
the state cannot take (an instance it does not know, another block size), a dispatch
already accounted (``duplicate``), a first token or end of a request it does not hold
(``unknown_id``: never accounted, already ended, or dropped). A peer's end is an
``on_finish`` whatever its outcome: its error, if any, is the peer's to count.
"""

from __future__ import annotations

from typing import Protocol

from router_worker.routing.features import RequestFeatures
from router_worker.routing.indicators import ClusterState
from router_worker.routing.lifecycle import Attempt, LifecycleObserver, Phase, RequestLifecycle


class PeerSink(Protocol):
    """Where a router's reports to its peers go: the live peer channel, or the
    simulator's delayed delivery to the other routers' states."""

    def dispatched(
        self, request_id: str, instance: str, features: RequestFeatures, cached_tokens: int | None
    ) -> None: ...

    def first_token(self, request_id: str) -> None: ...

    def ended(self, request_id: str, ok: bool) -> None: ...


class PeerReports(LifecycleObserver):
    """This router's requests, told to its peers: each dispatch (with the cached tokens it
    was accounted with, so every router weighs it alike), first token and end (``ok``:
    finished or moved, not failed, abandoned or refused).

    First tokens and finishes are told as the lifecycle hears of them; a driver whose own
    accounting of them lags the engine calls :meth:`engine_first_token` and
    :meth:`engine_finished` at the engine's time instead (``relays_at_once=False``)."""

    __slots__ = ("relays_at_once", "sink")

    def __init__(self, sink: PeerSink, relays_at_once: bool = True) -> None:
        self.sink = sink
        self.relays_at_once = relays_at_once

    def dispatched(self, life: RequestLifecycle, attempt: Attempt) -> None:
        cached = life.features.prompt_tokens - attempt.uncached_tokens
        self.sink.dispatched(life.request_id, attempt.instance, life.features, cached)

    def first_token(self, life: RequestLifecycle, attempt: Attempt) -> None:
        if self.relays_at_once:
            self.sink.first_token(life.request_id)

    def ended(self, life: RequestLifecycle, attempt: Attempt) -> None:
        finished = attempt.phase is Phase.FINISHED
        if self.relays_at_once or not finished:
            self.sink.ended(life.request_id, finished or attempt.phase is Phase.MIGRATED)

    def engine_first_token(self, life: RequestLifecycle) -> None:
        """The engine emitted ``life``'s first token (``relays_at_once=False``)."""
        self.sink.first_token(life.request_id)

    def engine_finished(self, life: RequestLifecycle) -> None:
        """The engine finished ``life`` (``relays_at_once=False``)."""
        self.sink.ended(life.request_id, True)


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
