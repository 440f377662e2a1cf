"""Each cluster's own event and metrics streams (what routers with a Redis identity write):
ingested like the shared ones, and an entry naming another cluster is quarantined there."""

from __future__ import annotations

import time
import uuid

import pytest
import redis
from django.conf import settings

from controlplane.models import Cluster, RouterEvent
from controlplane.services import ingest
from router_worker.contract.telemetry import (
    ArmMetrics,
    EventRecord,
    MetricsRecord,
    events_stream,
    metrics_stream,
)

pytestmark = pytest.mark.django_db(transaction=True)


def _health(cluster: str) -> EventRecord:
    return EventRecord.new(
        cluster, "r0", "health", time.time(), instance="i0", before="healthy", after="down"
    )


def test_a_clusters_own_streams_are_ingested_and_speak_for_it_only():
    names = [f"own-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    mine, other = (
        Cluster.objects.create(name=n, model="Qwen/Qwen2-7B-Instruct", gpu_type="h20")
        for n in names
    )
    client = redis.Redis.from_url(settings.REDIS_URL)
    keys = [f(n) for n in names for f in (events_stream, metrics_stream)]
    try:
        good, forged = _health(mine.name), _health(other.name)  # forged: in mine's stream
        for event in (good, forged):
            client.xadd(events_stream(mine.name), event.to_stream_fields())  # type: ignore[arg-type]  # stub: invariant dict
        record = MetricsRecord(
            id=uuid.uuid4().hex,
            cluster=other.name,
            router="r0",
            start=time.time() - 1,
            end=time.time(),
            arms={"default": ArmMetrics(policy="lmetric", requests=1)},
        )
        client.xadd(metrics_stream(mine.name), record.to_stream_fields())  # type: ignore[arg-type]  # stub: invariant dict
        ingest.ingest_events(client)  # (the shared streams may hold other tests' entries)
        ingest.ingest_metrics(client)
        stored = RouterEvent.objects.filter(cluster__name__in=names)
        assert list(stored.values_list("event_id", "cluster__name")) == [(good.id, mine.name)]
        assert client.xlen(metrics_stream(mine.name)) == 0  # settled, not left pending
        counts = ingest.quarantine_summary(client, limit=0).counts
        assert counts[events_stream(mine.name)] == 1 and counts[metrics_stream(mine.name)] == 1
    finally:
        client.delete(*keys)
        for name in names:
            for stream in (events_stream(name), metrics_stream(name)):
                client.hdel(ingest.QUARANTINE_COUNTS, stream)
        client.close()
