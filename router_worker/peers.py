"""Replica sync: routers on one fleet tell each other what they dispatched.

Several router processes behind a load balancer each keep their own
:class:`ClusterState` and account only their own dispatches: router B cannot see the
pending prefill of the requests router A has just sent, and both herd onto the same
instance until the next scrape. With replica sync each router publishes, on the Redis
pub/sub channel ``switchyard:peers:{cluster}``, what its requests do, and applies what
the *other* routers publish to its own state through the same ``on_dispatch`` /
``on_first_token`` / ``on_finish`` calls as its own requests, made by
:mod:`router_worker.routing.peer_accounting` (which the simulator's replica sync calls too).

Wire format: one signed JSON object per publish (a batch, flushed every
``FLUSH_INTERVAL_S``), plus an empty batch every ``HEARTBEAT_INTERVAL_S`` as a heartbeat.
Each publish is a header line, ``sy-peers-v2 <key id> <hex HMAC-SHA256>``, then the JSON
body; the MAC covers the channel and the body, so a batch is good for one cluster only::

    {"v": 2, "router": "r1", "nonce": "9f2c...", "seq": 41, "at": 1764600000.12,
     "msgs": [
       {"kind": "dispatch", "id": "r1/sy-3f-17", "instance": "i4", "prompt_tokens": 5210,
        "cached_tokens": 4096, "block_size": 16, "block_hashes": "<base64 uint64 LE>"},
       {"kind": "first_token", "id": "r1/sy-3f-17"},
       {"kind": "end", "id": "r1/sy-3f-17", "ok": true}]}

``cached_tokens`` is the sender's estimate (null on a retry: the receiver then uses its
own view).

Only the cluster's routers hold the signing key (the control plane hands it to the routers
it starts, in the environment, with their token: ``SWITCHYARD_PEER_KEY``; an older key in
``SWITCHYARD_PEER_KEY_PREVIOUS`` is still accepted while keys rotate). A router without a
key does not sync. A payload is refused before it is parsed when it is larger than
``MAX_PAYLOAD_BYTES``, unsigned, signed with an unknown key or badly; a batch older than
``MAX_SKEW_S`` or not newer than the sender's last (``seq``) is a replay, and so is one of
a dropped peer's process not newer than its last (remembered for twice ``MAX_SKEW_S``) or
of another process no newer (``at``) than the live one's last. Values are
bounded (``MAX_PROMPT_TOKENS``, ``MAX_BLOCKS``), and so are the peers a router holds
(``MAX_PEERS``) and the records per peer (``MAX_RECORDS_PER_PEER``). Every refused payload
or message is counted (``switchyard_router_peer_malformed_total{reason}``) and skipped on
its own: it never stops the subscriber nor touches other peers' records.

Request ids are namespaced by the sender's name, so they never collide with the
receiver's own. ``nonce`` is per process: a router restarted under the same name is
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
import contextlib
import hashlib
import hmac
import json
import logging
import math
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from router_worker.contract import telemetry as contract
from router_worker.contract.config import RouterConfig
from router_worker.contract.telemetry import peers_channel
from router_worker.metrics import RouterMetrics
from router_worker.routing import ClusterState, RequestFeatures
from router_worker.routing.peer_accounting import (
    apply_peer_dispatch,
    apply_peer_end,
    apply_peer_first_token,
)

log = logging.getLogger("router_worker.peers")

WIRE_VERSION = 2
SIGNED_PREFIX = b"sy-peers-v2 "
CHANNEL_PREFIX = "switchyard:peers:"
FLUSH_INTERVAL_S = 0.01
HEARTBEAT_INTERVAL_S = 1.0
QUEUE_LIMIT = 20_000
BATCH_LIMIT = 2_000  # messages per publish
MAX_PAYLOAD_BYTES = 256 * 1024  # refused unread above this; senders split their batches
MAX_HEADER_BYTES = 128
MAX_ID_CHARS = 256
MAX_NAME_CHARS = 256
MAX_BLOCKS = 16_384  # a longer prompt is published with its first MAX_BLOCKS block hashes
MAX_PROMPT_TOKENS = 1 << 24  # beyond any model's context
MAX_BLOCK_SIZE = 4_096
MAX_PEERS = 64
MAX_RECORDS_PER_PEER = 10_000
MAX_SKEW_S = 60.0  # a batch stamped further from our clock is stale (or replayed)
MIN_KEY_CHARS = 16
RESTART_DELAY_S = 0.5
RESTART_DELAY_MAX_S = 5.0
SWEEP_INTERVAL_S = 0.5

KINDS = ("dispatch", "first_token", "end")


def channel_for(cluster: str) -> str:
    return peers_channel(cluster)


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
    seq: int = 0  # strictly increasing per (router, nonce): an older one is a replay


class PeerKeys:
    """The cluster's signing key (signs and verifies) and the keys still accepted while
    they rotate (verify only). Each key is known by an id derived from it."""

    def __init__(self, current: str, previous: tuple[str, ...] = ()) -> None:
        for key in (current, *previous):
            if len(key) < MIN_KEY_CHARS:
                raise ValueError(f"a peer key must have at least {MIN_KEY_CHARS} characters")
        self._current = current.encode()
        self.key_id = key_id(current)
        self._accepted = {key_id(k): k.encode() for k in (current, *previous)}

    @classmethod
    def from_environment(cls, current: str | None, previous: str | None) -> PeerKeys | None:
        if not current:
            return None
        return cls(current, tuple(k for k in (previous or "").split(",") if k))

    def sign(self, channel: str, body: bytes) -> bytes:
        mac = _mac(self._current, channel, body)
        return SIGNED_PREFIX + f"{self.key_id} {mac}\n".encode() + body

    def verify(self, channel: str, payload: bytes) -> bytes:
        """The body of a signed payload; raises PeerMessageError unless its MAC is good."""
        if not payload.startswith(SIGNED_PREFIX):
            raise PeerMessageError("unsigned", "no signature header")
        header, newline, body = payload[: MAX_HEADER_BYTES + len(SIGNED_PREFIX)].partition(b"\n")
        if not newline:
            raise PeerMessageError("unsigned", "no signature header")
        body = payload[len(header) + 1 :]
        try:
            kid, mac = header[len(SIGNED_PREFIX) :].decode("ascii").split(" ")
        except (UnicodeDecodeError, ValueError):
            raise PeerMessageError("unsigned", "unreadable signature header") from None
        key = self._accepted.get(kid)
        if key is None:
            raise PeerMessageError("unknown_key", f"key id {kid[:16]!r}")
        if not hmac.compare_digest(mac, _mac(key, channel, body)):
            raise PeerMessageError("bad_signature")
        return body


def key_id(key: str) -> str:
    """A short public name for a key (reveals nothing about it)."""
    return hashlib.sha256(b"switchyard peer key id\0" + key.encode()).hexdigest()[:12]


def _mac(key: bytes, channel: str, body: bytes) -> str:
    return hmac.new(key, channel.encode() + b"\n" + body, hashlib.sha256).hexdigest()


encode_hashes = contract.encode_block_hashes


def decode_hashes(text: str) -> tuple[int, ...]:
    try:
        return contract.decode_block_hashes(text, MAX_BLOCKS)
    except ValueError as error:
        raise PeerMessageError("block_hashes", str(error)) from None


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


def encode_batch(
    router: str, nonce: str, at: float, messages: list[dict[str, Any]], seq: int = 0
) -> bytes:
    return join_batch(router, nonce, at, [_compact(m) for m in messages], seq)


def join_batch(router: str, nonce: str, at: float, parts: list[bytes], seq: int) -> bytes:
    """A batch body from messages already encoded one by one (see ``_compact``)."""
    head = _compact({"v": WIRE_VERSION, "router": router, "nonce": nonce, "seq": seq, "at": at})
    return head[:-1] + b',"msgs":[' + b",".join(parts) + b"]}"


def _compact(document: dict[str, Any]) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode()


def _text(item: dict[str, Any], key: str, limit: int) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value or len(value) > limit:
        raise PeerMessageError(key, f"{key} must be a non-empty string of <= {limit} chars")
    return value


def _count(
    item: dict[str, Any], key: str, limit: int = MAX_PROMPT_TOKENS, *, nullable: bool = False
) -> int | None:
    value = item.get(key)
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
        raise PeerMessageError(key, f"{key} must be an integer in 0..{limit}")
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
    block_size = _count(item, "block_size", MAX_BLOCK_SIZE)
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
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise PeerMessageError("json", "not JSON") from None
    if not isinstance(document, dict):
        raise PeerMessageError("envelope", "not an object")
    if document.get("v") != WIRE_VERSION:
        raise PeerMessageError("version", f"unsupported version {document.get('v')!r}")
    router = _text(document, "router", MAX_NAME_CHARS)
    nonce = _text(document, "nonce", 64)
    seq = _count(document, "seq", 2**63)
    assert seq is not None
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
        except Exception:  # anything else a crafted message could raise: skipped alone
            malformed.append("message")
    return PeerBatch(router, nonce, float(at), tuple(messages), tuple(malformed), seq)


# ----------------------------------------------------------------- what peers hold


@dataclass
class _Peer:
    nonce: str
    last_seen: float
    records: dict[str, float] = field(default_factory=dict)  # namespaced id -> applied at
    seq: int = -1  # the last batch's
    at: float = 0.0  # the last batch's own time (the sender's clock)


class PeerBook:
    """Other routers' requests as applied to one ClusterState (pure: no I/O, no clock)."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.peers: dict[str, _Peer] = {}
        # dropped peers' (router, nonce) -> (last seq, dropped at): a batch of theirs seen
        # again within MAX_SKEW_S (a captured one, replayed) is not a new peer
        self.retired: dict[tuple[str, str], tuple[int, float]] = {}

    def apply(self, batch: PeerBatch, now: float, count: Callable[[str, str], None]) -> None:
        """Apply a batch; ``count(outcome, label)`` is told of each message's fate
        (``applied``/kind, ``skipped``/reason or ``malformed``/reason). A message the
        state refuses is counted and skipped alone."""
        peer = self._peer(batch, now, count)
        if peer is None:
            return
        for message in batch.messages:
            try:
                count(*self._one(peer, message, now))
            except Exception as error:  # valid on the wire, refused by the state
                count("malformed", "apply")
                log.debug("peer message %s not applied: %r", message.id, error)

    def _one(self, peer: _Peer, message: PeerMessage, now: float) -> tuple[str, str]:
        if isinstance(message, PeerDispatch):
            return self._dispatch(peer, message, now)
        if isinstance(message, PeerFirstToken):
            return self._first_token(peer, message, now)
        return self._end(peer, message, now)

    def _peer(
        self, batch: PeerBatch, now: float, count: Callable[[str, str], None]
    ) -> _Peer | None:
        """The batch's sender, None (counted) when the batch is a replay or one peer too
        many."""
        peer = self.peers.get(batch.router)
        retired = self.retired.get((batch.router, batch.nonce))
        if (
            (peer is not None and peer.nonce == batch.nonce and batch.seq <= peer.seq)
            or (retired is not None and batch.seq <= retired[0])
            # another process's batch no newer than the live one's: a replay of the past
            or (peer is not None and peer.nonce != batch.nonce and batch.at <= peer.at)
        ):
            count("malformed", "replayed")
            return None
        if peer is not None and peer.nonce != batch.nonce:  # restarted under the same name
            self.drop_peer(batch.router, now, count, "peer_restarted")
            peer = None
        if peer is None:
            if len(self.peers) >= MAX_PEERS:
                count("malformed", "too_many_peers")
                return None
            peer = self.peers[batch.router] = _Peer(batch.nonce, now)
        peer.last_seen, peer.seq, peer.at = now, batch.seq, batch.at
        self.retired.pop((batch.router, batch.nonce), None)
        return peer

    def _dispatch(self, peer: _Peer, message: PeerDispatch, now: float) -> tuple[str, str]:
        if len(peer.records) >= MAX_RECORDS_PER_PEER:
            return "skipped", "peer_full"
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
        for key, (_, dropped_at) in list(self.retired.items()):
            if now - dropped_at > 2 * MAX_SKEW_S:  # its batches are stale by now anyway
                del self.retired[key]
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
        if len(self.retired) < MAX_PEERS * 4:
            self.retired[name, peer.nonce] = (peer.seq, now)
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
        keys: PeerKeys | None = None,
    ) -> None:
        self.name = name
        self.nonce = os.urandom(8).hex()
        self.redis_url = redis_url
        self.metrics = metrics
        self.keys = keys
        self._state_source = state_source
        self._seq = 0
        self.enabled = False  # config says peer_sync, and there are a Redis URL and a key
        self.disabled_reason: str | None = None
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
        reason = None
        if not settings.peer_sync:
            reason = "off"
        elif self.redis_url is None:
            reason = "no_redis"
        elif self.keys is None:
            reason = "no_key"
            if self.disabled_reason != reason:
                log.warning("peer sync is on but this router has no peer key: not syncing")
        enabled, self.disabled_reason = reason is None, reason
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
        """Publish what is queued (a heartbeat if nothing is), split into signed batches
        no larger than peers accept."""
        assert self.keys is not None, "enabled only with a key"
        items = [self._queue.popleft() for _ in range(min(len(self._queue), BATCH_LIMIT))]
        channel = channel_for(self.cluster)
        chunks = self._chunks(items)
        for index, chunk in enumerate(chunks):
            self._seq += 1
            body = join_batch(self.name, self.nonce, now, [part for _, part in chunk], self._seq)
            try:
                await self._client().publish(channel, self.keys.sign(channel, body))
            except Exception as error:  # Redis down: drop and count, never block requests
                self._set_connected(False, error)
                self._count("dropped", "publish_failed", sum(len(c) for c in chunks[index:]))
                return
            self._set_connected(True)
            for kind, _ in chunk:
                self._count("sent", kind)

    def _chunks(self, items: list[_Outgoing]) -> list[list[tuple[str, bytes]]]:
        budget = MAX_PAYLOAD_BYTES - 1024  # the header and the envelope
        chunks: list[list[tuple[str, bytes]]] = [[]]
        size = 0
        for item in items:
            part = _compact(self._wire(item))
            if len(part) > budget:
                self._count("dropped", "too_large")
                continue
            if size + len(part) + 1 > budget:
                chunks.append([])
                size = 0
            chunks[-1].append((_KIND_OF[item[0]], part))
            size += len(part) + 1
        return chunks

    def _wire(self, item: _Outgoing) -> dict[str, Any]:
        tag, request_id = item[0], f"{self.name}/{item[1]}"
        if tag == "d":
            _, _, instance, prompt, cached, block_size, hashes = item
            prompt = min(prompt, MAX_PROMPT_TOKENS)
            cached = None if cached is None else min(cached, prompt)
            hashes = tuple(hashes[:MAX_BLOCKS])  # the prefix: where caches are shared
            return encode_message(
                PeerDispatch(request_id, instance, prompt, cached, block_size, hashes)
            )
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
        """One published batch: authenticated, validated, then applied unless it is our
        own. Whatever it holds, it is counted and never raises (the subscriber lives on)."""
        if not self.enabled or self._state_source() is None:
            return
        try:
            self._receive(payload.encode() if isinstance(payload, str) else payload, now)
        except Exception:  # a bug, not the peer's fault; still never the subscriber's end
            self._count("malformed", "internal")
            log.exception("peer payload not handled")

    def _receive(self, payload: bytes, now: float) -> None:
        assert self.keys is not None, "enabled only with a key"
        if len(payload) > MAX_PAYLOAD_BYTES:  # refused before it is even verified
            self._count("malformed", "too_large")
            return
        try:
            batch = decode_batch(self.keys.verify(channel_for(self.cluster), payload))
        except PeerMessageError as error:
            self._count("malformed", error.reason)
            log.debug("peer message skipped: %s", error)
            return
        if batch.router == self.name and batch.nonce == self.nonce:
            return
        if abs(now - batch.at) > MAX_SKEW_S:
            self._count("malformed", "stale")
            return
        for reason in batch.malformed:
            self._count("malformed", reason)
        if batch.router == self.name:  # another process under our name: ids could clash
            self._count("malformed", "same_name")
            return
        self.book().apply(batch, now, self._count)

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
            "disabled": self.disabled_reason,
            "key_id": self.keys.key_id if self.keys else None,
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
