"""Replica sync's wire format and the bookkeeping of peers' requests (router_worker/peers)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from router_worker.metrics import RouterMetrics
from router_worker.peers import (
    PeerBatch,
    PeerBook,
    PeerDispatch,
    PeerEnd,
    PeerFirstToken,
    PeerMessageError,
    PeerSync,
    decode_batch,
    encode_batch,
    encode_message,
)
from router_worker.routing import ClusterState, RequestFeatures, build_features

BIG = (1 << 64) - 1  # block hashes use the whole uint64 range


def _dispatch(
    request_id: str = "ra/sy-1", instance: str = "i0", prompt: int = 64, cached: int | None = 16
) -> PeerDispatch:
    return PeerDispatch(request_id, instance, prompt, cached, 16, (1, BIG, 3, 4))


def _batch(messages: list[Any], router: str = "ra", nonce: str = "n1") -> bytes:
    return encode_batch(router, nonce, 1.5, messages)


def test_messages_round_trip():
    sent = [
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
        (json.dumps({"v": 2, "router": "ra", "nonce": "n", "at": 1, "msgs": []}), "version"),
        (json.dumps({"v": 1, "nonce": "n", "at": 1, "msgs": []}), "router"),
        (json.dumps({"v": 1, "router": "ra", "nonce": "n", "at": "x", "msgs": []}), "at"),
        (json.dumps({"v": 1, "router": "ra", "nonce": "n", "at": 1, "msgs": {}}), "msgs"),
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
    book.apply(PeerBatch(router, nonce, now, tuple(messages)), now, counts)


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


# ----------------------------------------------------------------- PeerSync.receive


def _sync(state: ClusterState, name: str = "rb") -> PeerSync:
    from router_worker.config import parse_config

    sync = PeerSync(name, "redis://127.0.0.1:1/0", RouterMetrics(), lambda: state)
    sync.configure(
        parse_config(
            {"instances": [{"name": "i0", "url": "http://h:1"}], "policy": {"kind": "round_robin"}}
        )
    )
    return sync


def test_receive_applies_peers_skips_its_own_and_counts_malformed():
    state = _state()
    sync = _sync(state)
    sync.receive(_batch([DISPATCH]), 1.0)
    own = encode_batch("rb", sync.nonce, 1.0, [encode_message(_dispatch("rb/sy-1"))])
    sync.receive(own, 1.0)
    sync.receive(b"{", 1.0)
    sync.receive(_batch([{**DISPATCH, "kind": "?"}]), 1.0)
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
    sync.receive(_batch([]), 0.0)  # a peer's heartbeat
    sync.dispatched("sy-1", "i0", features, None)
    sync.first_token("sy-1")
    sync.ended("sy-1", True)
    assert sync.stats(0.0)["queued"] == 2 and sync.counts == {"dropped:queue_full": 1}
    wired = [sync._wire(item) for item in sync._queue]
    assert [m["id"] for m in wired] == ["rb/sy-1", "rb/sy-1"]
    assert decode_batch(_batch(wired, router="rb")).malformed == ()
