"""Replica sync: routers on one fleet tell each other what they dispatched (issue 20 item 3).

Several router processes behind a load balancer each keep their own
:class:`ClusterState` and account only their own dispatches: router B cannot see the
pending prefill of the requests router A has just sent, and both herd onto the same
instance until the next scrape. With replica sync each router publishes, on the Redis
pub/sub channel ``switchyard:peers:{cluster}``, what its requests do, and applies what
the *other* routers publish to its own state through the same ``on_dispatch`` /
``on_first_token`` / ``on_finish`` calls as its own requests, made by
:mod:`router_worker.routing.peer_accounting` (which the simulator's replica sync calls too).

Wire format: one JSON object per publish (a batch, flushed every ``FLUSH_INTERVAL_S``),
plus an empty batch every ``HEARTBEAT_INTERVAL_S`` as a heartbeat::

    {"v": 1, "router": "r1", "nonce": "9f2c...", "at": 1764600000.12,
     "msgs": [
       {"kind": "dispatch", "id": "r1/sy-3f-17", "instance": "i4", "prompt_tokens": 5210,
        "cached_tokens": 4096, "block_size": 16, "block_hashes": "<base64 uint64 LE>"},
       {"kind": "first_token", "id": "r1/sy-3f-17"},
       {"kind": "end", "id": "r1/sy-3f-17", "ok": true}]}

``cached_tokens`` is the sender's estimate (null on a retry: the receiver then uses its
own view). Request ids are namespaced by the sender's name, so they never collide with
the receiver's own. ``nonce`` is per process: a router restarted under the same name is
a new peer (its predecessor's records are dropped).

The request path only appends a tuple to a bounded queue (``PeerSync.dispatched``,
``first_token``, ``ended``); encoding and publishing run in a background task. When
the queue is full or Redis refuses a publish, messages are dropped and counted: peers
then drop the sender's records once its heartbeats stop (``peer_timeout_s``), and
records older than ``peer_max_age_s`` are dropped in any case, so a lost ``end`` costs
at most that long. Incoming messages are validated one by one; a malformed one is
skipped and counted, never applied.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import math
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from router_worker.config import RouterConfig
from router_worker.metrics import RouterMetrics
from router_worker.routing import ClusterState, RequestFeatures
from router_worker.routing.peer_accounting import (
    apply_peer_dispatch,
    apply_peer_end,
    apply_peer_first_token,
)

log = logging.getLogger("router_worker.peers")

WIRE_VERSION = 1
CHANNEL_PREFIX = "switchyard:peers:"
FLUSH_INTERVAL_S = 0.01
HEARTBEAT_INTERVAL_S = 1.0
QUEUE_LIMIT = 20_000
BATCH_LIMIT = 2_000  # messages per publish
MAX_PAYLOAD_BYTES = 16 * 1024 * 1024
MAX_ID_CHARS = 256
MAX_NAME_CHARS = 256
MAX_BLOCKS = 1_000_000
RESTART_DELAY_S = 0.5
RESTART_DELAY_MAX_S = 5.0
SWEEP_INTERVAL_S = 0.5

KINDS = ("dispatch", "first_token", "end")


def channel_for(cluster: str) -> str:
    return CHANNEL_PREFIX + cluster


class PeerMessageError(ValueError):
    """An incoming peer message is malformed; ``reason`` is its metric label."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


# ----------------------------------------------------------------- the wire format


@dataclass(frozen=True, slots=True)
class PeerDispatch:
    id: str
    instance: str
    prompt_tokens: int
    cached_tokens: int | None
    block_size: int
    block_hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PeerFirstToken:
    id: str


@dataclass(frozen=True, slots=True)
class PeerEnd:
    id: str
    ok: bool


PeerMessage = PeerDispatch | PeerFirstToken | PeerEnd


@dataclass(frozen=True, slots=True)
class PeerBatch:
    router: str
    nonce: str
    at: float
    messages: tuple[PeerMessage, ...]
    malformed: tuple[str, ...] = ()  # reasons of the messages skipped while decoding


def encode_hashes(hashes: tuple[int, ...] | list[int]) -> str:
    return base64.b64encode(np.asarray(hashes, dtype=np.uint64).astype("<u8").tobytes()).decode(
        "ascii"
    )


def decode_hashes(text: str) -> tuple[int, ...]:
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise PeerMessageError("block_hashes", "not base64") from None
    if len(raw) % 8 or len(raw) // 8 > MAX_BLOCKS:
        raise PeerMessageError("block_hashes", "not a whole number of uint64")
    return tuple(np.frombuffer(raw, dtype="<u8").tolist())


def encode_message(message: PeerMessage) -> dict[str, Any]:
    if isinstance(message, PeerDispatch):
        return {
            "kind": "dispatch",
            "id": message.id,
            "instance": message.instance,
            "prompt_tokens": message.prompt_tokens,
            "cached_tokens": message.cached_tokens,
            "block_size": message.block_size,
            "block_hashes": encode_hashes(message.block_hashes),
        }
    if isinstance(message, PeerFirstToken):
        return {"kind": "first_token", "id": message.id}
    return {"kind": "end", "id": message.id, "ok": message.ok}


def encode_batch(router: str, nonce: str, at: float, messages: list[dict[str, Any]]) -> bytes:
    return json.dumps(
        {"v": WIRE_VERSION, "router": router, "nonce": nonce, "at": at, "msgs": messages},
        separators=(",", ":"),
    ).encode()


def _text(item: dict[str, Any], key: str, limit: int) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value or len(value) > limit:
        raise PeerMessageError(key, f"{key} must be a non-empty string of <= {limit} chars")
    return value


def _count(item: dict[str, Any], key: str, *, nullable: bool = False) -> int | None:
    value = item.get(key)
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PeerMessageError(key, f"{key} must be a non-negative integer")
    return value


def decode_message(item: Any, router: str) -> PeerMessage:
    """One message of a batch from ``router``; raises PeerMessageError if malformed."""
    if not isinstance(item, dict):
        raise PeerMessageError("message", "not an object")
    kind = item.get("kind")
    if kind not in KINDS:
        raise PeerMessageError("kind", f"unknown kind {kind!r}")
    request_id = _text(item, "id", MAX_ID_CHARS)
    if not request_id.startswith(router + "/"):
        raise PeerMessageError("id", "request id not namespaced by its router")
    if kind == "first_token":
        return PeerFirstToken(request_id)
    if kind == "end":
        ok = item.get("ok")
        if not isinstance(ok, bool):
            raise PeerMessageError("ok", "ok must be a boolean")
        return PeerEnd(request_id, ok)
    prompt = _count(item, "prompt_tokens")
    cached = _count(item, "cached_tokens", nullable=True)
    block_size = _count(item, "block_size")
    hashes = item.get("block_hashes")
    if not isinstance(hashes, str):
        raise PeerMessageError("block_hashes", "block_hashes must be a base64 string")
    assert prompt is not None and block_size is not None
    if block_size < 1:
        raise PeerMessageError("block_size", "block_size must be positive")
    blocks = decode_hashes(hashes)
    if len(blocks) > prompt // block_size or (cached is not None and cached > prompt):
        raise PeerMessageError("tokens", "more blocks or cached tokens than prompt tokens")
    return PeerDispatch(request_id, _text(item, "instance", 64), prompt, cached, block_size, blocks)


def decode_batch(payload: bytes | str) -> PeerBatch:
    """A published batch; raises PeerMessageError when the envelope itself is unusable.
    Malformed messages inside a usable envelope are skipped (their reasons listed)."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise PeerMessageError("too_large")
    try:
        document = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        raise PeerMessageError("json", "not JSON") from None
    if not isinstance(document, dict):
        raise PeerMessageError("envelope", "not an object")
    if document.get("v") != WIRE_VERSION:
        raise PeerMessageError("version", f"unsupported version {document.get('v')!r}")
    router = _text(document, "router", MAX_NAME_CHARS)
    nonce = _text(document, "nonce", 64)
    at = document.get("at")
    if isinstance(at, bool) or not isinstance(at, int | float) or not math.isfinite(at):
        raise PeerMessageError("at", "at must be a finite number")
    items = document.get("msgs")
    if not isinstance(items, list):
        raise PeerMessageError("msgs", "msgs must be a list")
    messages: list[PeerMessage] = []
    malformed: list[str] = []
    for item in items:
        try:
            messages.append(decode_message(item, router))
        except PeerMessageError as error:
            malformed.append(error.reason)
    return PeerBatch(router, nonce, float(at), tuple(messages), tuple(malformed))


# ----------------------------------------------------------------- what peers hold


@dataclass
class _Peer:
    nonce: str
    last_seen: float
    records: dict[str, float] = field(default_factory=dict)  # namespaced id -> applied at


class PeerBook:
    """Other routers' requests as applied to one ClusterState (pure: no I/O, no clock)."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.peers: dict[str, _Peer] = {}

    def apply(self, batch: PeerBatch, now: float, count: Callable[[str, str], None]) -> None:
        """Apply a batch; ``count(outcome, label)`` is told of each message's fate
        (``applied``/kind or ``skipped``/reason)."""
        peer = self._peer(batch, now, count)
        for message in batch.messages:
            if isinstance(message, PeerDispatch):
                outcome = self._dispatch(peer, message, now)
            elif isinstance(message, PeerFirstToken):
                outcome = self._first_token(peer, message, now)
            else:
                outcome = self._end(peer, message, now)
            count(*outcome)

    def _peer(self, batch: PeerBatch, now: float, count: Callable[[str, str], None]) -> _Peer:
        peer = self.peers.get(batch.router)
        if peer is not None and peer.nonce != batch.nonce:  # restarted under the same name
            self.drop_peer(batch.router, now, count, "peer_restarted")
            peer = None
        if peer is None:
            peer = self.peers[batch.router] = _Peer(batch.nonce, now)
        peer.last_seen = now
        return peer

    def _dispatch(self, peer: _Peer, message: PeerDispatch, now: float) -> tuple[str, str]:
        features = RequestFeatures(
            message.id,
            message.prompt_tokens,
            message.block_hashes,
            message.block_size,
            None,
            None,
            now,
        )
        skipped = apply_peer_dispatch(
            self.state, features, message.instance, now, message.cached_tokens
        )
        if skipped is not None:
            return "skipped", skipped
        peer.records[message.id] = now
        return "applied", "dispatch"

    def _first_token(self, peer: _Peer, message: PeerFirstToken, now: float) -> tuple[str, str]:
        if message.id not in peer.records:
            return "skipped", "unknown_id"
        skipped = apply_peer_first_token(self.state, message.id, now)
        return ("skipped", skipped) if skipped is not None else ("applied", "first_token")

    def _end(self, peer: _Peer, message: PeerEnd, now: float) -> tuple[str, str]:
        if peer.records.pop(message.id, None) is None:
            return "skipped", "unknown_id"
        skipped = apply_peer_end(self.state, message.id, now)
        return ("skipped", skipped) if skipped is not None else ("applied", "end")

    def sweep(
        self, now: float, timeout_s: float, max_age_s: float, count: Callable[[str, str], None]
    ) -> None:
        """Drop silent peers' records, and records older than ``max_age_s``."""
        for name, peer in list(self.peers.items()):
            if now - peer.last_seen > timeout_s:
                self.drop_peer(name, now, count, "peer_timeout")
                continue
            for request_id, applied_at in list(peer.records.items()):
                if now - applied_at > max_age_s:
                    self._forget(peer, request_id, now)
                    count("dropped", "max_age")

    def drop_peer(
        self, name: str, now: float, count: Callable[[str, str], None], reason: str
    ) -> None:
        peer = self.peers.pop(name, None)
        if peer is None:
            return
        for request_id in list(peer.records):
            self._forget(peer, request_id, now)
            count("dropped", reason)

    def clear(self, now: float, count: Callable[[str, str], None], reason: str) -> None:
        for name in list(self.peers):
            self.drop_peer(name, now, count, reason)

    def _forget(self, peer: _Peer, request_id: str, now: float) -> None:
        peer.records.pop(request_id, None)
        apply_peer_end(self.state, request_id, now)

    def stats(self, now: float) -> dict[str, Any]:
        return {
            name: {"seen_s_ago": round(now - peer.last_seen, 3), "records": len(peer.records)}
            for name, peer in self.peers.items()
        }


# ----------------------------------------------------------------- the process side


_Outgoing = tuple[Any, ...]  # ("d", id, instance, prompt, cached, block_size, hashes) | ...


class PeerSync:
    """Publishes this router's request lifecycle and applies other routers' (see module)."""

    def __init__(
        self,
        name: str,
        redis_url: str | None,
        metrics: RouterMetrics,
        state_source: Callable[[], ClusterState | None],
    ) -> None:
        self.name = name
        self.nonce = os.urandom(8).hex()
        self.redis_url = redis_url
        self.metrics = metrics
        self._state_source = state_source
        self.enabled = False  # config says peer_sync and there is a Redis URL
        self.cluster = "default"
        self.timeout_s = 5.0
        self.max_age_s = 900.0
        self._queue: deque[_Outgoing] = deque()
        self._book: PeerBook | None = None
        self._redis: Any = None
        self.connected: bool | None = None
        self.counts: dict[str, int] = {}

    # ----- configuration -------------------------------------------------------------
    def configure(self, config: RouterConfig) -> None:
        settings = config.router
        enabled = settings.peer_sync and self.redis_url is not None
        if not enabled or config.cluster != self.cluster:
            self._queue.clear()
            if self._book is not None:
                self._book.clear(time.time(), self._count, "disabled")
        self.enabled, self.cluster = enabled, config.cluster
        self.timeout_s, self.max_age_s = settings.peer_timeout_s, settings.peer_max_age_s

    # ----- the request path: enqueue only ---------------------------------------------
    @property
    def publishing(self) -> bool:
        """Requests are published only while some peer is listening (heartbeats always
        are, so peers find each other): a lone router pays nothing per request."""
        return self.enabled and self._book is not None and bool(self._book.peers)

    def dispatched(
        self, request_id: str, instance: str, features: RequestFeatures, cached_tokens: int | None
    ) -> None:
        if self.publishing:
            self._put(
                (
                    "d",
                    request_id,
                    instance,
                    features.prompt_tokens,
                    cached_tokens,
                    features.block_size,
                    features.block_hashes,
                )
            )

    def first_token(self, request_id: str) -> None:
        if self.publishing:
            self._put(("f", request_id))

    def ended(self, request_id: str, ok: bool) -> None:
        if self.publishing:
            self._put(("e", request_id, ok))

    def _put(self, item: _Outgoing) -> None:
        if len(self._queue) >= QUEUE_LIMIT:
            self._count("dropped", "queue_full")
            return
        self._queue.append(item)

    # ----- background tasks -----------------------------------------------------------
    async def run(self) -> None:
        """Publisher and subscriber, each restarted (and counted) if it dies."""
        await asyncio.gather(
            supervised("publisher", self._publish_loop, self.metrics),
            supervised("subscriber", self._subscribe_loop, self.metrics),
        )

    async def _publish_loop(self) -> None:
        next_heartbeat = 0.0
        while True:
            await asyncio.sleep(FLUSH_INTERVAL_S)
            if not self.enabled:
                continue
            now = time.time()
            if self._queue or now >= next_heartbeat:
                await self._publish(now)
                next_heartbeat = now + HEARTBEAT_INTERVAL_S

    async def _publish(self, now: float) -> None:
        items = [self._queue.popleft() for _ in range(min(len(self._queue), BATCH_LIMIT))]
        payload = encode_batch(self.name, self.nonce, now, [self._wire(i) for i in items])
        try:
            await self._client().publish(channel_for(self.cluster), payload)
        except Exception as error:  # Redis down: drop and count, never block requests
            self._set_connected(False, error)
            self._count("dropped", "publish_failed", len(items))
            return
        self._set_connected(True)
        for item in items:
            self._count("sent", _KIND_OF[item[0]])

    def _wire(self, item: _Outgoing) -> dict[str, Any]:
        tag, request_id = item[0], f"{self.name}/{item[1]}"
        if tag == "d":
            return encode_message(PeerDispatch(request_id, *item[2:]))
        if tag == "f":
            return encode_message(PeerFirstToken(request_id))
        return encode_message(PeerEnd(request_id, item[2]))

    async def _subscribe_loop(self) -> None:
        pubsub = None
        subscribed: str | None = None
        next_sweep = 0.0
        try:
            while True:
                wanted = channel_for(self.cluster) if self.enabled else None
                if wanted != subscribed:
                    if pubsub is not None:
                        await pubsub.aclose()
                        pubsub = None
                    if wanted is not None:
                        pubsub = self._client().pubsub(ignore_subscribe_messages=True)
                        await pubsub.subscribe(wanted)
                    subscribed = wanted
                if pubsub is None:
                    await asyncio.sleep(0.2)
                else:
                    message = await pubsub.get_message(timeout=0.2)
                    if message is not None and message.get("type") == "message":
                        self.receive(message["data"], time.time())
                now = time.time()
                if now >= next_sweep:
                    self.sweep(now)
                    next_sweep = now + SWEEP_INTERVAL_S
        except asyncio.CancelledError:
            raise
        except Exception:
            # Redis down: nothing arrives from peers, so their records cannot be trusted
            # to end; they are dropped (as the peers' timeout would), then we resubscribe.
            if self._state_source() is not None:
                self.book().clear(time.time(), self._count, "redis_down")
            raise
        finally:
            if pubsub is not None:
                with contextlib.suppress(Exception):  # closing a broken connection
                    await pubsub.aclose()

    # ----- incoming -------------------------------------------------------------------
    def book(self) -> PeerBook:
        state = self._state_source()
        assert state is not None
        if self._book is None or self._book.state is not state:
            self._book = PeerBook(state)  # a new state (block size changed) starts empty
        return self._book

    def receive(self, payload: bytes | str, now: float) -> None:
        """One published batch: validated, then applied unless it is our own."""
        if not self.enabled or self._state_source() is None:
            return
        try:
            batch = decode_batch(payload)
        except PeerMessageError as error:
            self._count("malformed", error.reason)
            log.debug("peer message skipped: %s", error)
            return
        if batch.router == self.name and batch.nonce == self.nonce:
            return
        for reason in batch.malformed:
            self._count("malformed", reason)
        if batch.router == self.name:  # another process under our name: ids could clash
            self._count("malformed", "same_name")
            return
        try:
            self.book().apply(batch, now, self._count)
        except (ValueError, KeyError) as error:  # valid on the wire, refused by the state
            self._count("malformed", "apply")
            log.debug("peer batch from %s not applied: %s", batch.router, error)

    def sweep(self, now: float) -> None:
        if self._state_source() is not None:
            self.book().sweep(now, self.timeout_s, self.max_age_s, self._count)
        self.metrics.peers.set(len(self._book.peers) if self._book else 0)

    # ----- accounting -----------------------------------------------------------------
    def _count(self, outcome: str, label: str, amount: int = 1) -> None:
        key = f"{outcome}:{label}"
        self.counts[key] = self.counts.get(key, 0) + amount
        family = {
            "sent": self.metrics.peer_sent,
            "applied": self.metrics.peer_applied,
            "skipped": self.metrics.peer_skipped,
            "dropped": self.metrics.peer_dropped,
            "malformed": self.metrics.peer_malformed,
        }[outcome]
        self.metrics.child(family, label).inc(amount)

    def _client(self) -> Any:
        if self._redis is None:
            import redis.asyncio as aioredis

            assert self.redis_url is not None, "only called with Redis configured"
            self._redis = aioredis.Redis.from_url(
                self.redis_url, socket_timeout=1.0, socket_connect_timeout=0.5
            )
        return self._redis

    def _set_connected(self, connected: bool, error: Exception | None = None) -> None:
        if connected != self.connected:
            if connected:
                log.info("peer sync: Redis reachable")
            else:
                log.warning("peer sync: Redis unreachable (%s); dropping peer messages", error)
        self.connected = connected

    def stats(self, now: float) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "channel": channel_for(self.cluster),
            "nonce": self.nonce,
            "redis": self.connected,
            "queued": len(self._queue),
            "timeout_s": self.timeout_s,
            "max_age_s": self.max_age_s,
            "peers": self._book.stats(now) if self._book else {},
            "counts": dict(sorted(self.counts.items())),
        }

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()


_KIND_OF = {"d": "dispatch", "f": "first_token", "e": "end"}


async def supervised(
    what: str, loop: Callable[[], Awaitable[None]], metrics: RouterMetrics
) -> None:
    """Run ``loop`` forever: if it raises, count it, wait a little and start it again
    (backing off to ``RESTART_DELAY_MAX_S`` while it keeps failing, e.g. Redis down)."""
    delay = RESTART_DELAY_S
    while True:
        started = time.monotonic()
        try:
            await loop()
        except asyncio.CancelledError:
            raise
        except Exception as error:  # any crash is counted and restarted
            metrics.child(metrics.peer_task_restarts, what).inc()
            if time.monotonic() - started > RESTART_DELAY_MAX_S:
                delay = RESTART_DELAY_S  # it ran a while: a new failure, not the same one
            log.warning("peer sync %s stopped (%s); restarting in %.1f s", what, error, delay)
            await asyncio.sleep(delay)
            delay = min(2 * delay, RESTART_DELAY_MAX_S)
