"""Poison entries in the telemetry streams: each is quarantined (dead-letter stream, counted),
every valid entry of the same batch still lands, and the next run is not stuck on it."""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Iterator
from typing import Any, cast

import pytest
import redis
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from controlplane.models import ArmMetricRollup, HotspotEvent, RouterEvent
from controlplane.services import ingest
from router_worker.contract.telemetry import (
    EVENTS_STREAM,
    METRICS_STREAM,
    ArmMetrics,
    MetricsRecord,
)

pytestmark = pytest.mark.django_db(transaction=True)
CLUSTER = "ops-test"
STREAM_KEYS = (EVENTS_STREAM, METRICS_STREAM, ingest.QUARANTINE_STREAM, ingest.QUARANTINE_COUNTS)


@pytest.fixture
def streams(redis_client: redis.Redis) -> Iterator[redis.Redis]:
    redis_client.delete(*STREAM_KEYS)
    yield redis_client
    redis_client.delete(*STREAM_KEYS)


def hotspot(**payload: Any) -> dict[str, Any]:
    fields = {
        "transition": "confirmed",
        "prefix_class": "c1",
        "prefix_hash": "abc",
        "x": 9.0,
        "x_bar": 1.0,
        "m": 2,
        "m_bar": 14,
        "window": 30.0,
        "instances": ["i0"],
    }
    return {**fields, **payload}


def wire(kind: str = "hotspot", **overrides: Any) -> dict[str, Any]:
    event = {
        "id": uuid.uuid4().hex,
        "cluster": CLUSTER,
        "router": "r0",
        "kind": kind,
        "at": time.time(),
        "payload": hotspot() if kind == "hotspot" else {},
    }
    return {**event, **overrides}


def add_raw(client: redis.Redis, stream: str, document: Any) -> None:
    data = document if isinstance(document, str) else json.dumps(document, allow_nan=True)
    client.xadd(stream, {"data": data})


def stored_event_ids() -> set[str]:
    return set(HotspotEvent.objects.values_list("event_id", flat=True)) | set(
        RouterEvent.objects.values_list("event_id", flat=True)
    )


def quarantined(client: redis.Redis) -> list[dict[bytes, bytes]]:
    entries = cast(
        "list[tuple[bytes, dict[bytes, bytes]]]", client.xrange(ingest.QUARANTINE_STREAM)
    )
    return [fields for _, fields in entries]


POISON_EVENTS = {
    "hotspot payload missing its numbers": wire(payload={"transition": "confirmed"}),
    "hotspot transition unknown": wire(payload=hotspot(transition="melted")),
    "hotspot m beyond an int column": wire(payload=hotspot(m=2**40)),
    "hotspot prefix class over 64 chars": wire(payload=hotspot(prefix_class="c" * 65)),
    "timestamp beyond year 9999": wire(at=1e20),
    "negative timestamp overflow": wire(at=-1e300),
    "timestamp NaN": wire(at=math.nan),
    "router name over 64 chars": wire(kind="health", router="r" * 65),
    "event id over 64 chars": wire(kind="health", id="e" * 65),
    "NUL in the router name": wire(kind="health", router="r\x000"),
    "NaN inside a payload": wire(kind="health", payload={"ratio": math.nan}),
    "unknown cluster": wire(kind="health", cluster="no-such-cluster"),
    "not JSON": "{not json",
}


@pytest.mark.parametrize("poison", POISON_EVENTS.values(), ids=POISON_EVENTS.keys())
def test_a_poison_event_is_quarantined_and_the_rest_of_its_batch_lands(streams, cluster, poison):
    before = [wire(), wire(kind="health", payload={"instance": "i1", "after": "down"})]
    after = [wire(payload=hotspot(transition="cleared")), wire(kind="config_applied")]
    for document in (*before, poison, *after):
        add_raw(streams, EVENTS_STREAM, document)
    result = ingest.ingest_events(streams)
    assert (result.read, result.stored, result.quarantined) == (5, 4, 1)
    assert stored_event_ids() == {e["id"] for e in before + after}
    [entry] = quarantined(streams)
    assert entry[b"source"] == EVENTS_STREAM.encode() and entry[b"reason"]
    raw = poison if isinstance(poison, str) else json.dumps(poison, allow_nan=True)
    assert entry[b"data"].decode() == raw  # inspectable as it was sent
    assert int(streams.hget(ingest.QUARANTINE_COUNTS, EVENTS_STREAM)) == 1
    # Nothing is left pending: the next run does not re-read the poison entry.
    add_raw(streams, EVENTS_STREAM, fresh := wire(kind="health"))
    assert (ingest.ingest_events(streams).read, fresh["id"] in stored_event_ids()) == (1, True)


def metrics_record(record_id: str, start: float, requests: int = 3) -> dict[str, Any]:
    record = MetricsRecord(
        id=record_id,
        cluster=CLUSTER,
        router="r0",
        start=start,
        end=start + 1,
        arms={"baseline": ArmMetrics(policy="lmetric", requests=requests, ttft_s=[0.1])},
    )
    return record.model_dump()


POISON_METRICS = {
    "start beyond year 9999": metrics_record("bad-1", 1e20),
    "NaN sample": {
        **metrics_record("bad-2", 1_800_000_000.0),
        "arms": {"baseline": {"policy": "lmetric", "ttft_s": [math.nan]}},
    },
    "request count beyond an int column": metrics_record("bad-3", 1_800_000_000.0, 2**40),
    "negative TTFT sample": {
        **metrics_record("bad-5", 1_800_000_000.0),
        "arms": {"baseline": {"policy": "lmetric", "requests": 1, "ttft_s": [-5.0]}},
    },
    "TTFT sample beyond an hour": {
        **metrics_record("bad-6", 1_800_000_000.0),
        "arms": {"baseline": {"policy": "lmetric", "requests": 1, "ttft_s": [1e9]}},
    },
    "negative request count": metrics_record("bad-7", 1_800_000_000.0, -3),
    "a router the cluster does not have": {
        **metrics_record("bad-8", 1_800_000_000.0),
        "router": "forged",
    },
    "arm name over 64 chars": {
        **metrics_record("bad-4", 1_800_000_000.0),
        "arms": {"a" * 65: {"policy": "lmetric", "requests": 1}},
    },
}


@pytest.mark.parametrize("poison", POISON_METRICS.values(), ids=POISON_METRICS.keys())
def test_a_poison_metrics_record_is_quarantined_and_the_others_fold(
    streams, cluster, cluster_router, poison
):
    start = 1_800_000_000.0
    add_raw(streams, METRICS_STREAM, metrics_record("ok-1", start))
    add_raw(streams, METRICS_STREAM, poison)
    add_raw(streams, METRICS_STREAM, metrics_record("ok-2", start + 1))
    result = ingest.ingest_metrics(streams)
    assert (result.stored, result.quarantined) == (2, 1)
    row = ArmMetricRollup.objects.get(cluster=cluster, arm="baseline")
    assert (row.requests, len(row.ttft_samples)) == (6, 2)  # nothing of the poison folded
    assert streams.xlen(METRICS_STREAM) == 0
    assert len(quarantined(streams)) == 1


# ----- property: whatever the routers (or anyone with Redis access) write -----------------

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=70)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)


def maybe(valid: st.SearchStrategy, hostile: st.SearchStrategy = json_values) -> st.SearchStrategy:
    return st.one_of(valid, valid, hostile)


hostile_payloads = st.fixed_dictionaries(
    {key: maybe(st.just(value)) for key, value in hotspot().items()}
)
hostile_events = st.fixed_dictionaries(
    {
        "id": maybe(st.uuids().map(lambda u: u.hex), st.text(max_size=80)),
        "cluster": maybe(st.just(CLUSTER)),
        "router": maybe(st.just("r0"), st.text(max_size=80)),
        "kind": maybe(
            st.sampled_from(["hotspot", "health", "config_applied"]), st.text(max_size=8)
        ),
        "at": maybe(st.floats(0, 4e9), st.floats() | st.integers()),
        "payload": maybe(hostile_payloads, json_values),
    }
)
hostile_entries = st.one_of(hostile_events, json_values, st.text(max_size=40))


@given(poison=st.lists(hostile_entries, min_size=1, max_size=6))
@hypothesis_settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_no_entry_stops_ingest_or_takes_a_valid_neighbour_with_it(
    streams, cluster, cluster_router, poison
):
    streams.delete(*STREAM_KEYS)
    valid = [wire(), wire(kind="health", payload={"instance": "i1"})]
    for document in [valid[0], *poison, valid[1]]:
        add_raw(streams, EVENTS_STREAM, document)
    result = ingest.ingest_events(streams)
    assert result.read == len(poison) + 2
    assert result.stored + result.duplicates + result.quarantined == result.read
    assert {e["id"] for e in valid} <= stored_event_ids()
    assert len(quarantined(streams)) == result.quarantined
    pending = streams.xpending(EVENTS_STREAM, ingest.GROUP)["pending"]
    assert pending == 0 and ingest.ingest_events(streams).read == 0


def test_quarantine_summary_counts_and_lists_the_newest_entries_first(
    streams, cluster, cluster_router
):
    far_future = json.dumps(wire(at=1e20))
    add_raw(streams, EVENTS_STREAM, far_future)
    add_raw(streams, EVENTS_STREAM, "{not json")
    ingest.ingest_events(streams)
    summary = ingest.quarantine_summary(streams, limit=10)
    assert (summary.counts, summary.total) == ({EVENTS_STREAM: 2}, 2)
    assert [e.data for e in summary.entries] == ["{not json", far_future]
    assert all(e.reason and e.source == EVENTS_STREAM for e in summary.entries)


def test_a_forged_count_or_a_wrong_typed_stream_stops_no_ingest(streams, cluster, cluster_router):
    """A non-integer count made HINCRBY fail the batch's settlement (its count stopped), and
    a string where a cluster's stream belongs failed the read of every stream after it."""
    from controlplane.models import Cluster
    from router_worker.contract.telemetry import metrics_stream

    squatter = Cluster.objects.create(name="aaa-squatted", model="m", gpu_type="h20")
    streams.set(metrics_stream(squatter.name), "not a stream")
    streams.hset(ingest.QUARANTINE_COUNTS, METRICS_STREAM, "lots")
    start = 1_800_000_000.0
    add_raw(streams, METRICS_STREAM, metrics_record("ok-1", start))
    add_raw(streams, METRICS_STREAM, POISON_METRICS["negative TTFT sample"])
    add_raw(streams, metrics_stream(CLUSTER), metrics_record("ok-2", start + 1))
    try:
        result = ingest.ingest_metrics(streams)
        assert (result.stored, result.quarantined) == (2, 1)
        assert result.unreadable == [metrics_stream(squatter.name)]
        assert int(streams.hget(ingest.QUARANTINE_COUNTS, METRICS_STREAM)) == 1
    finally:
        streams.delete(metrics_stream(squatter.name), metrics_stream(CLUSTER))


def test_the_quarantine_keeps_the_newest_1000_entries_and_counts_them_all(
    streams, cluster, cluster_router
):
    """The README: the dead-letter stream keeps the newest 1 000 entries (Redis trims whole
    nodes of at most 100, so a few more may stay), the count keeps every one."""
    sent = 1_500
    pipe = streams.pipeline(transaction=False)
    for k in range(sent):
        pipe.xadd(EVENTS_STREAM, {"data": f"{{not json {k}"})
    pipe.execute()
    while ingest.ingest_events(streams).read:
        pass
    kept = [fields[b"data"].decode() for fields in quarantined(streams)]
    assert 1_000 <= len(kept) < 1_100, len(kept)
    assert kept[-1_000:] == [f"{{not json {k}" for k in range(sent - 1_000, sent)]
    assert kept == [f"{{not json {k}" for k in range(sent - len(kept), sent)]  # newest only
    summary = ingest.quarantine_summary(streams, limit=10)
    assert (summary.counts, summary.total) == ({EVENTS_STREAM: sent}, sent)
