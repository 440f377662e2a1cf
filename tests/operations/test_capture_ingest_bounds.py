"""Capture ingest cannot be wedged and keeps no prompt fingerprint.

Ingest stores capture entries in committed slices within a per-run byte budget, so a run
always ends before its task's time limit and what it stored stays stored; a request the
rows cannot hold (an oversize prompt) never takes its batch with it; the quarantine keeps
no block hash of a refused entry; a router's keyed digests are stored as they came."""

from __future__ import annotations

import base64
import contextlib
import time
import uuid

import numpy as np
import pytest
from celery.exceptions import SoftTimeLimitExceeded

from controlplane.models import CapturedRequest
from controlplane.services import captures, ingest
from router_worker.contract.capture import CaptureKey
from router_worker.contract.telemetry import CaptureBatch, capture_stream, encode_block_hashes
from tests.operations.test_captures import OPERATOR, wire

STREAM = capture_stream("ops-test")
MAX_CAPTURE_BLOCKS = captures.MAX_BLOCKS


@pytest.fixture
def streams(redis_client):
    keys = (STREAM, ingest.QUARANTINE_STREAM, ingest.QUARANTINE_COUNTS)
    redis_client.delete(*keys)
    yield redis_client
    redis_client.delete(*keys)


@pytest.fixture
def routed(cluster, cluster_router):
    """The cluster with an instance and an active policy: it has a router config."""
    from controlplane.models import Policy

    cluster.instances.create(name="i0", url="http://127.0.0.1:9")
    cluster.active_policy = Policy.objects.create(cluster=cluster, name="rr", kind="round_robin")
    cluster.save()
    return cluster


def _send(client, capture, requests, router: str = "r0", keyed: bool = False) -> str:
    batch = CaptureBatch(
        id=uuid.uuid4().hex,
        cluster="ops-test",
        router=router,
        capture=capture.pk,
        requests=requests,
        keyed=keyed,
    )
    client.xadd(STREAM, batch.to_stream_fields())
    return batch.id


def _prompt(blocks: int, seed: int) -> tuple[int, ...]:
    return tuple(np.random.default_rng(seed).integers(1, 2**62, blocks).tolist())


def test_a_run_past_its_time_limit_never_wedges_ingest(routed, streams, monkeypatch):
    """Scaled down: a run is cut off (as Celery's soft time limit would) once it has taken
    five large entries' time; twelve such entries are pending. Before: every run rolled
    back and read the same entries again, storing nothing. Now each run commits what it
    stores in slices and stops within its budget (four entries' bytes here)."""
    capture = captures.start_capture(OPERATOR, routed.pk, name="big")
    now = time.time()
    for index in range(12):
        _send(streams, capture, [wire(now + index, ids=_prompt(4096, index))])
    size = len(streams.xrange(STREAM, count=1)[0][1][b"data"])
    monkeypatch.setattr(ingest, "CAPTURE_SLICE_BYTES", size)
    monkeypatch.setattr(ingest, "CAPTURE_RUN_BYTES", 4 * size)
    store, calls = captures.store_batch, {"n": 0}

    def slow_store(batch, clusters):
        calls["n"] += 1
        if calls["n"] > 5:
            raise SoftTimeLimitExceeded()
        return store(batch, clusters)

    monkeypatch.setattr(captures, "store_batch", slow_store)
    for _ in range(3):
        calls["n"] = 0
        with contextlib.suppress(SoftTimeLimitExceeded):  # the task ends; its commits stay
            ingest.ingest_captures(streams)
    capture.refresh_from_db()
    assert capture.requests == 12 == CapturedRequest.objects.filter(capture=capture).count()
    assert streams.xlen(STREAM) == 0


def test_the_run_budget_leaves_the_rest_pending_for_the_next_run(routed, streams, monkeypatch):
    capture = captures.start_capture(OPERATOR, routed.pk, name="budget")
    now = time.time()
    for index in range(6):
        _send(streams, capture, [wire(now + index, ids=_prompt(2048, index))])
    size = len(streams.xrange(STREAM, count=1)[0][1][b"data"])
    monkeypatch.setattr(ingest, "CAPTURE_SLICE_BYTES", 2 * size)
    monkeypatch.setattr(ingest, "CAPTURE_RUN_BYTES", 2 * size)
    first = ingest.ingest_captures(streams)
    assert (first.read, first.stored) == (2, 2)
    assert CapturedRequest.objects.filter(capture=capture).count() == 2
    while ingest.ingest_captures(streams).read:
        pass
    assert CapturedRequest.objects.filter(capture=capture).count() == 6


def test_one_oversize_prompt_does_not_fail_its_batch(routed, streams):
    """A router from before the cap sends a prompt of more than MAX_CAPTURE_BLOCKS blocks:
    its first blocks are kept, and the batch's other requests are stored with it."""
    capture = captures.start_capture(OPERATOR, routed.pk, name="oversize")
    now = time.time()
    huge = _prompt(MAX_CAPTURE_BLOCKS + 10, 1)
    _send(streams, capture, [wire(now), wire(now + 1, ids=huge), wire(now + 2)])
    result = ingest.ingest_captures(streams)
    assert (result.stored, result.quarantined) == (1, 0)
    rows = list(CapturedRequest.objects.filter(capture=capture).order_by("at"))
    assert [len(r.hash_ids) for r in rows] == [2, MAX_CAPTURE_BLOCKS, 2]


def test_the_quarantine_keeps_no_block_hash_of_a_refused_capture_entry(routed, streams):
    capture = captures.start_capture(OPERATOR, routed.pk, name="leak")
    secret = _prompt(64, 7)
    _send(streams, capture, [wire(time.time(), ids=secret)], router="stranger")
    assert ingest.ingest_captures(streams).quarantined == 1
    [entry] = [e for e in ingest.quarantine_summary(streams).entries if e.source == STREAM]
    assert "unknown router" in entry.reason
    assert encode_block_hashes(secret) not in entry.data
    assert encode_block_hashes(secret)[:24] not in entry.data
    assert '"block_hashes":"(withheld)"' in entry.data and '"prompt_tokens":40' in entry.data


def test_an_entry_over_the_byte_cap_is_quarantined_without_its_hashes(routed, streams, monkeypatch):
    capture = captures.start_capture(OPERATOR, routed.pk, name="cap")
    monkeypatch.setattr(captures, "MAX_CAPTURE_ENTRY_BYTES", 10_000)
    secret = _prompt(2000, 3)
    _send(streams, capture, [wire(time.time(), ids=secret)])
    assert ingest.ingest_captures(streams).quarantined == 1
    [entry] = [e for e in ingest.quarantine_summary(streams).entries if e.source == STREAM]
    assert "more than 10000" in entry.reason
    assert base64.b64encode(np.asarray(secret[:8], "<u8").tobytes()).decode()[:40] not in (
        entry.data
    )
    assert not CapturedRequest.objects.filter(capture=capture).exists()


def test_keyed_digests_from_the_router_are_stored_as_they_came(routed, streams):
    capture = captures.start_capture(OPERATOR, routed.pk, name="keyed")
    raw = (11, 12, 13)
    keyed = CaptureKey(capture.salt).block_ids(raw)
    _send(streams, capture, [wire(time.time(), ids=tuple(keyed))], keyed=True)
    _send(streams, capture, [wire(time.time() + 1, ids=raw)])  # a router before keying
    ingest.ingest_captures(streams)
    rows = list(CapturedRequest.objects.filter(capture=capture).order_by("at"))
    assert [r.hash_ids for r in rows] == [keyed, keyed]
