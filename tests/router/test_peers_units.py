"""Replica sync's wire format and the bookkeeping of peers' requests (router_worker/peers)."""

from __future__ import annotations

import itertools
import json
import os
from typing import Any

import pytest

from router_worker.metrics import RouterMetrics
from router_worker.peers import (
    PeerBatch,
    PeerBook,
    PeerDispatch,
    PeerEnd,
    PeerFirstToken,
    PeerKeys,
    PeerMessageError,
    PeerSync,
    channel_for,
    decode_batch,
    encode_batch,
    encode_message,
)
from router_worker.routing import ClusterState, RequestFeatures, build_features

BIG = (1 << 64) - 1  # block hashes use the whole uint64 range
SEQ = itertools.count(1)  # batches of one sender are numbered
REDIS_URL = os.environ.get("SWITCHYARD_REDIS_URL", "redis://127.0.0.1:6379/10")


def _dispatch(
    request_id: str = "ra/sy-1", instance: str = "i0", prompt: int = 64, cached: int | None = 16
) -> PeerDispatch:
    return PeerDispatch(request_id, instance, prompt, cached, 16, (1, BIG, 3, 4))


KEY = "k" * 32
KEYS = PeerKeys(KEY)
CHANNEL = channel_for("default")


def _batch(messages: list[Any], router: str = "ra", nonce: str = "n1", seq: int = 0) -> bytes:
    return encode_batch(router, nonce, 1.5, messages, seq)


def _signed(body: bytes, keys: PeerKeys = KEYS, channel: str = CHANNEL) -> bytes:
    return keys.sign(channel, body)


def test_messages_round_trip():
    sent: list[PeerDispatch | PeerFirstToken | PeerEnd] = [
        _dispatch(),
        _dispatch("ra/sy-2", cached=None),
        PeerFirstToken("ra/sy-1"),
        PeerEnd("ra/sy-1", False),
    ]
    batch = decode_batch(_batch([encode_message(m) for m in sent]))
    assert batch == PeerBatch("ra", "n1", 1.5, tuple(sent))


def _one(item: dict[str, Any]) -> bytes:
    return _batch([item])


DISPATCH = encode_message(_dispatch())


@pytest.mark.parametrize(
    ("item", "reason"),
    [
        ({**DISPATCH, "kind": "explode"}, "kind"),
        ({**DISPATCH, "id": "sy-1"}, "id"),  # not namespaced by its sender
        ({**DISPATCH, "id": "rb/sy-1"}, "id"),  # another router's namespace
        ({**DISPATCH, "id": 7}, "id"),
        ({**DISPATCH, "prompt_tokens": -1}, "prompt_tokens"),
        ({**DISPATCH, "prompt_tokens": True}, "prompt_tokens"),
        ({**DISPATCH, "cached_tokens": "16"}, "cached_tokens"),
        ({**DISPATCH, "block_size": 0}, "block_size"),
        ({**DISPATCH, "block_hashes": "%%%"}, "block_hashes"),
        ({**DISPATCH, "block_hashes": "AAAA"}, "block_hashes"),  # 3 bytes: not a uint64
        ({**DISPATCH, "block_hashes": [1, 2]}, "block_hashes"),
        ({**DISPATCH, "prompt_tokens": 20}, "tokens"),  # 4 blocks of 16 need 64 tokens
        ({**DISPATCH, "cached_tokens": 65}, "tokens"),
        ({**DISPATCH, "instance": ""}, "instance"),
        ({"kind": "end", "id": "ra/sy-1", "ok": "yes"}, "ok"),
        ("dispatch", "message"),
    ],
)
def test_a_malformed_message_is_skipped_with_its_reason(item, reason):
    good = encode_message(PeerFirstToken("ra/sy-9"))
    batch = decode_batch(_batch([item, good]))
    assert batch.malformed == (reason,)
    assert batch.messages == (PeerFirstToken("ra/sy-9"),)


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"not json", "json"),
        (b"\xff\xfe", "json"),
        (b"[1, 2]", "envelope"),
        (json.dumps({"v": 1, "router": "ra", "nonce": "n", "at": 1, "msgs": []}), "version"),
        (json.dumps({"v": 2, "nonce": "n", "at": 1, "msgs": []}), "router"),
        (json.dumps({"v": 2, "router": "ra", "nonce": "n", "seq": 1, "at": "x"}), "at"),
        (json.dumps({"v": 2, "router": "ra", "nonce": "n", "seq": 1, "at": 1, "msgs": {}}), "msgs"),
        (json.dumps({"v": 2, "router": "ra", "nonce": "n", "seq": -1, "at": 1, "msgs": []}), "seq"),
        (b"[" * 200_000, "json"),  # nested too deep for the parser
    ],
)
def test_an_unusable_envelope_raises_with_its_reason(payload, reason):
    with pytest.raises(PeerMessageError) as caught:
        decode_batch(payload)
    assert caught.value.reason == reason


# ----------------------------------------------------------------- PeerBook


class Counts(dict[str, int]):
    def __call__(self, outcome: str, label: str) -> None:
        key = f"{outcome}:{label}"
        self[key] = self.get(key, 0) + 1


def _state() -> ClusterState:
    state = ClusterState(block_size=16)
    for name in ("i0", "i1"):
        state.add_instance(name)
    return state


def _apply(
    book: PeerBook,
    messages: list[Any],
    now: float,
    counts: Counts,
    router: str = "ra",
    nonce: str = "n1",
) -> None:
    book.apply(PeerBatch(router, nonce, now, tuple(messages), seq=next(SEQ)), now, counts)


def test_a_peers_request_goes_through_the_state_like_our_own():
    state, counts = _state(), Counts()
    book = PeerBook(state)
    _apply(book, [_dispatch()], 10.0, counts)
    slot = state.slot_of("i0")
    assert state.pending[slot] == 48 and state.in_flight[slot] == 1
    same_prefix = RequestFeatures("x", 64, (1, BIG, 3, 4), 16, None, None, 0.0)
    assert state.view().cached_blocks(same_prefix).tolist() == [4, 0]  # the shadow KV index
    _apply(book, [PeerFirstToken("ra/sy-1")], 10.5, counts)
    assert state.pending[slot] == 0 and state.decoding[slot] == 1
    _apply(book, [PeerEnd("ra/sy-1", True)], 11.0, counts)
    assert state.in_flight[slot] == 0 and state.decoding[slot] == 0
    assert counts == {"applied:dispatch": 1, "applied:first_token": 1, "applied:end": 1}


def test_inapplicable_messages_are_skipped_and_counted():
    state, counts = _state(), Counts()
    book = PeerBook(state)
    _apply(
        book,
        [
            _dispatch(),
            _dispatch(),
            _dispatch("ra/sy-2", instance="i9"),
            PeerDispatch("ra/sy-3", "i0", 64, None, 32, (1, 2)),
            PeerFirstToken("ra/sy-8"),
            PeerEnd("ra/sy-8", True),
        ],
        1.0,
        counts,
    )
    assert counts == {
        "applied:dispatch": 1,
        "skipped:duplicate": 1,
        "skipped:unknown_instance": 1,
        "skipped:block_size": 1,
        "skipped:unknown_id": 2,
    }
    assert state.in_flight.sum() == 1


def test_a_silent_peer_and_old_records_are_dropped():
    state, counts = _state(), Counts()
    book = PeerBook(state)
    _apply(book, [_dispatch("ra/sy-1"), _dispatch("ra/sy-2", instance="i1")], 0.0, counts)
    _apply(book, [_dispatch("rb/sy-1")], 0.0, counts, router="rb")
    _apply(book, [_dispatch("rb/sy-2", instance="i1")], 50.0, counts, router="rb")
    book.sweep(50.0, timeout_s=5.0, max_age_s=30.0, count=counts)
    # ra: silent for 50 s, both dropped; rb: alive, its 50 s old request dropped by age
    assert counts["dropped:peer_timeout"] == 2 and counts["dropped:max_age"] == 1
    assert list(book.peers) == ["rb"] and list(book.peers["rb"].records) == ["rb/sy-2"]
    assert state.in_flight[state.slot_of("i0")] == 0
    assert state.in_flight[state.slot_of("i1")] == 1


def test_a_peer_restarted_under_the_same_name_loses_its_old_records():
    state, counts = _state(), Counts()
    book = PeerBook(state)
    _apply(book, [_dispatch()], 0.0, counts)
    _apply(book, [], 1.0, counts, nonce="n2")
    assert counts["dropped:peer_restarted"] == 1 and state.in_flight.sum() == 0


def test_a_replayed_batch_of_a_dropped_peer_is_not_a_new_peer():
    """A captured signed batch was accepted again within MAX_SKEW_S once its sender had
    been dropped (timed out): its records came back."""
    state, counts = _state(), Counts()
    book = PeerBook(state)
    captured = PeerBatch("ra", "n1", 0.0, (_dispatch(),), seq=7)
    book.apply(captured, 0.0, counts)
    book.sweep(10.0, timeout_s=5.0, max_age_s=30.0, count=counts)
    assert counts["dropped:peer_timeout"] == 1 and state.in_flight.sum() == 0
    book.apply(captured, 11.0, counts)  # replayed, still within the skew window
    assert counts["malformed:replayed"] == 1 and state.in_flight.sum() == 0
    book.apply(PeerBatch("ra", "n1", 12.0, (), seq=8), 12.0, counts)  # it was alive after all
    assert list(book.peers) == ["ra"]


def test_an_older_process_batch_does_not_wipe_a_live_peers_records():
    state, counts = _state(), Counts()
    book = PeerBook(state)
    old = PeerBatch("ra", "n-old", 1.0, (), seq=50)  # captured from its previous process
    book.apply(PeerBatch("ra", "n-new", 5.0, (_dispatch(),), seq=1), 5.0, counts)
    book.apply(old, 6.0, counts)
    assert counts["malformed:replayed"] == 1 and "dropped:peer_restarted" not in counts
    assert state.in_flight.sum() == 1 and book.peers["ra"].nonce == "n-new"


# ----------------------------------------------------------------- PeerSync.receive


def _sync(
    state: ClusterState, name: str = "rb", keys: PeerKeys | None = KEYS, cluster: str = "default"
) -> PeerSync:
    from router_worker.contract.config import parse_config

    sync = PeerSync(name, "redis://127.0.0.1:1/0", RouterMetrics(), lambda: state, keys)
    document = {
        "cluster": cluster,
        "instances": [{"name": "i0", "url": "http://h:1"}],
        "policy": {"kind": "round_robin"},
    }
    sync.configure(parse_config(document))
    return sync


def test_receive_applies_peers_skips_its_own_and_counts_malformed():
    state = _state()
    sync = _sync(state)
    sync.receive(_signed(_batch([DISPATCH], seq=1)), 1.0)
    own = encode_batch("rb", sync.nonce, 1.0, [encode_message(_dispatch("rb/sy-1"))])
    sync.receive(_signed(own), 1.0)
    sync.receive(_signed(b"{"), 1.0)
    sync.receive(_signed(_batch([{**DISPATCH, "kind": "?"}], seq=2)), 1.0)
    assert state.in_flight.sum() == 1
    assert sync.counts == {"applied:dispatch": 1, "malformed:json": 1, "malformed:kind": 1}
    rendered = sync.metrics.render().decode()
    assert 'switchyard_router_peer_malformed_total{reason="json"} 1.0' in rendered


def test_the_request_path_only_queues_and_a_full_queue_drops_and_counts(monkeypatch):
    import router_worker.peers as peers

    monkeypatch.setattr(peers, "QUEUE_LIMIT", 2)
    sync = _sync(_state())
    features = build_features("sy-1", list(range(40)), 0.0)
    sync.dispatched("sy-1", "i0", features, None)
    assert sync.stats(0.0)["queued"] == 0  # nobody listens: nothing is published
    sync.receive(_signed(_batch([])), 0.0)  # a peer's heartbeat
    sync.dispatched("sy-1", "i0", features, None)
    sync.first_token("sy-1")
    sync.ended("sy-1", True)
    assert sync.stats(0.0)["queued"] == 2 and sync.counts == {"dropped:queue_full": 1}
    wired = [sync._wire(item) for item in sync._queue]
    assert [m["id"] for m in wired] == ["rb/sy-1", "rb/sy-1"]
    assert decode_batch(_batch(wired, router="rb")).malformed == ()


# ----------------------------------------------------------------- hostile peers


def _hostile(prompt_tokens: int, request_id: str) -> dict[str, Any]:
    return {**DISPATCH, "id": request_id, "prompt_tokens": prompt_tokens, "cached_tokens": 0}


@pytest.mark.parametrize(
    "prompt_tokens", [10**308, 10**400, (1 << 24) + 1], ids=["1e308", "1e400", "cap+1"]
)
def test_out_of_range_token_counts_are_refused_on_the_wire(prompt_tokens):
    """Two dispatches of ~1e308 tokens used to make an instance's pending load inf for
    good; 10**400 raised OverflowError in the state. Both are malformed now."""
    body = _batch([_hostile(prompt_tokens, "ra/sy-1"), _hostile(prompt_tokens, "ra/sy-2")])
    batch = decode_batch(body)
    assert batch.malformed == ("prompt_tokens", "prompt_tokens") and batch.messages == ()
    state, counts = _state(), Counts()
    PeerBook(state).apply(batch, 1.0, counts)
    assert state.pending.tolist() == [0, 0] and counts == {}


def test_a_hostile_payload_never_stops_the_subscriber_nor_drops_other_peers():
    """A batch whose values the state cannot take is counted; the peer that was already
    applied keeps its records, and later batches are still applied."""
    state = _state()
    sync = _sync(state)
    sync.receive(_signed(_batch([DISPATCH], router="ra", seq=1)), 1.0)
    hostile = _batch([_hostile(10**400, "rx/sy-1")], router="rx", seq=1)
    sync.receive(_signed(hostile), 1.0)  # raised OverflowError (and killed the subscriber)
    sync.receive(_signed(_batch([encode_message(PeerFirstToken("ra/sy-1"))], seq=2)), 1.5)
    assert sync.counts["malformed:prompt_tokens"] == 1
    assert sync.counts["applied:dispatch"] == 1 and sync.counts["applied:first_token"] == 1
    assert list(sync.book().peers["ra"].records) == ["ra/sy-1"]
    assert all(map(float.__eq__, state.pending.tolist(), [0.0, 0.0]))


@pytest.mark.parametrize(
    ("keys", "channel", "reason"),
    [
        (None, CHANNEL, "unsigned"),
        (PeerKeys("not-the-cluster-key!"), CHANNEL, "unknown_key"),
        (KEYS, channel_for("another-cluster"), "bad_signature"),  # replayed from elsewhere
    ],
)
def test_unsigned_or_badly_signed_batches_are_counted_and_dropped(keys, channel, reason):
    """A forged batch under a real peer's name and a new nonce used to wipe that peer's
    records (taken for a restart); now it is refused before it is read."""
    state = _state()
    sync = _sync(state)
    sync.receive(_signed(_batch([DISPATCH], seq=1)), 1.0)
    forged = _batch([_hostile(60_000, "ra/sy-2")], nonce="forged", seq=9)
    sync.receive(forged if keys is None else keys.sign(channel, forged), 1.5)
    assert sync.counts == {"applied:dispatch": 1, f"malformed:{reason}": 1}
    assert list(sync.book().peers["ra"].records) == ["ra/sy-1"]
    assert state.pending[state.slot_of("i0")] == 48
    rendered = sync.metrics.render().decode()
    assert f'switchyard_router_peer_malformed_total{{reason="{reason}"}} 1.0' in rendered


def test_a_tampered_body_fails_its_signature():
    signed = bytearray(_signed(_batch([DISPATCH], seq=1)))
    signed[signed.index(b"48") if b"48" in signed else -3] ^= 1
    sync = _sync(_state())
    sync.receive(bytes(signed), 1.0)
    assert sync.counts == {"malformed:bad_signature": 1}


def test_an_oversized_batch_is_refused_before_it_is_read():
    import router_worker.peers as peers

    sync = _sync(_state())
    junk = b"x" * (peers.MAX_PAYLOAD_BYTES + 1)  # would be "unsigned" if it were looked at
    sync.receive(junk, 1.0)
    sync.receive(_signed(b"{" + b" " * peers.MAX_PAYLOAD_BYTES + b"}"), 1.0)
    assert sync.counts == {"malformed:too_large": 2}


def test_replayed_and_stale_batches_are_refused():
    state = _state()
    sync = _sync(state)
    first = _signed(_batch([DISPATCH], seq=5))
    sync.receive(first, 1.0)
    sync.receive(_signed(_batch([encode_message(PeerEnd("ra/sy-1", True))], seq=6)), 1.2)
    sync.receive(first, 1.4)  # the dispatch again, after its end
    sync.receive(_signed(encode_batch("rc", "n", 1.5, [DISPATCH], 1)), 1.5 + 3600)
    assert sync.counts == {
        "applied:dispatch": 1,
        "applied:end": 1,
        "malformed:replayed": 1,
        "malformed:stale": 1,
    }
    assert state.in_flight.sum() == 0


def test_peers_and_records_per_peer_are_bounded(monkeypatch):
    import router_worker.peers as peers

    monkeypatch.setattr(peers, "MAX_PEERS", 2)
    monkeypatch.setattr(peers, "MAX_RECORDS_PER_PEER", 2)
    state, counts = _state(), Counts()
    book = PeerBook(state)
    three = [_dispatch(f"ra/sy-{k}", prompt=64) for k in range(3)]
    _apply(book, three, 1.0, counts)
    _apply(book, [], 1.0, counts, router="rb")
    _apply(book, [_dispatch("rc/sy-1")], 1.0, counts, router="rc")
    assert counts == {
        "applied:dispatch": 2,
        "skipped:peer_full": 1,
        "malformed:too_many_peers": 1,
    }
    assert sorted(book.peers) == ["ra", "rb"] and len(book.peers["ra"].records) == 2


def test_a_large_queue_is_published_in_batches_peers_accept():
    """Over the real Redis: each published payload is within MAX_PAYLOAD_BYTES, signed,
    and every message arrives at a peer (the longest prompts cut to MAX_BLOCKS hashes)."""
    import asyncio
    import uuid

    import redis

    import router_worker.peers as peers

    cluster = f"units-{uuid.uuid4().hex[:10]}"
    sync = _sync(_state(), name="rb", cluster=cluster)
    sync.redis_url = REDIS_URL
    sync.receive(KEYS.sign(channel_for(cluster), _batch([], seq=1)), 0.0)  # a peer listens
    features = build_features("sy-0", list(range(16 * 40_000)), 0.0)  # 40k blocks each
    for k in range(8):
        sync.dispatched(f"sy-{k}", "i0", features, None)
    client = redis.Redis.from_url(REDIS_URL)
    pubsub = client.pubsub()
    pubsub.subscribe(channel_for(cluster))
    assert pubsub.get_message(timeout=5)["type"] == "subscribe"

    async def publish() -> None:
        await sync._publish(1.0)
        await sync.close()

    try:
        asyncio.run(publish())
        published = [m["data"] for m in iter(lambda: pubsub.get_message(timeout=0.5), None)]
    finally:
        pubsub.close()
        client.close()
    assert len(published) > 1 and all(len(p) <= peers.MAX_PAYLOAD_BYTES for p in published)
    receiver = _sync(_state(), name="rz", cluster=cluster)
    for payload in published:
        receiver.receive(payload, 1.0)
    assert receiver.counts == {"applied:dispatch": 8}
    assert sync.counts == {"sent:dispatch": 8}


def test_keys_rotate_and_a_router_without_a_key_does_not_sync():
    old, new = "old-cluster-key-0123", "new-cluster-key-4567"
    rotated = _sync(_state(), keys=PeerKeys(new, (old,)))
    rotated.receive(PeerKeys(old).sign(CHANNEL, _batch([DISPATCH], seq=1)), 1.0)
    assert rotated.counts == {"applied:dispatch": 1}  # a peer not restarted yet
    stale = _sync(_state(), keys=PeerKeys(old))
    stale.receive(PeerKeys(new).sign(CHANNEL, _batch([DISPATCH], seq=1)), 1.0)
    assert stale.counts == {"malformed:unknown_key": 1}
    alone = _sync(_state(), keys=None)
    alone.receive(_signed(_batch([DISPATCH], seq=1)), 1.0)
    alone.dispatched("sy-1", "i0", build_features("sy-1", list(range(40)), 0.0), None)
    assert alone.stats(1.0)["disabled"] == "no_key" and alone.counts == {}
    with pytest.raises(ValueError):
        PeerKeys("short")
