"""Ingest of the routers' Redis streams: idempotent, and nothing lost while Postgres is down."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from controlplane.models import ArmMetricRollup, HotspotEvent, RouterEvent
from controlplane.services import ingest
from devharness import free_port
from router_worker.contract.telemetry import (
    EVENTS_STREAM,
    METRICS_STREAM,
    ArmMetrics,
    EventRecord,
    MetricsRecord,
)

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.django_db(transaction=True)


def hotspot_event(cluster: str = "ops-test", transition: str = "confirmed") -> EventRecord:
    return EventRecord.new(
        cluster,
        "r0",
        "hotspot",
        time.time(),
        transition=transition,
        prefix_class="c1",
        prefix_hash="abc",
        x=9.0,
        x_bar=1.0,
        m=2,
        m_bar=14,
        window=30.0,
        instances=["i0", "i1"],
    )


def test_events_become_rows_and_a_redelivered_event_is_stored_once(redis_client, cluster):
    first = hotspot_event()
    health = EventRecord.new(
        "ops-test",
        "r0",
        "health",
        time.time(),
        instance="i3",
        before="healthy",
        after="down",
        cause="connect error",
    )
    for event in (first, health, first):  # `first` delivered twice
        redis_client.xadd(EVENTS_STREAM, event.to_stream_fields())
    result = ingest.ingest_events(redis_client)
    assert (result.read, result.stored, result.duplicates) == (3, 2, 1)
    row = HotspotEvent.objects.get(event_id=first.id)
    assert (row.transition, row.m, row.m_bar, row.instances) == ("confirmed", 2, 14, ["i0", "i1"])
    assert RouterEvent.objects.get(event_id=health.id).payload["after"] == "down"
    assert ingest.ingest_events(redis_client).read == 0  # everything acknowledged


def test_malformed_entries_are_counted_not_fatal(redis_client, cluster):
    redis_client.xadd(EVENTS_STREAM, {"data": "{not json"})
    redis_client.xadd(EVENTS_STREAM, hotspot_event().to_stream_fields())
    result = ingest.ingest_events(redis_client)
    assert (result.quarantined, result.stored) == (1, 1)


def test_events_read_while_postgres_is_down_arrive_after_it_returns(redis_client, cluster):
    events = [hotspot_event(transition=t) for t in ("suspected", "confirmed", "cleared")]
    for event in events:
        redis_client.xadd(EVENTS_STREAM, event.to_stream_fields())
    # An ingest process whose database is unreachable reads the entries but must not ack.
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "controlplane.settings_test",
        "SWITCHYARD_DATABASE_URL": f"postgres://postgres@127.0.0.1:{free_port()}/x",
    }
    script = (
        "import django; django.setup(); from controlplane.services import ingest, notify;"
        "ingest.ingest_events(notify.redis_client())"
    )
    failed = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert failed.returncode != 0 and "OperationalError" in failed.stderr
    assert HotspotEvent.objects.count() == 0
    # Database back (our own connection): the pending entries are delivered again.
    result = ingest.ingest_events(redis_client)
    assert result.stored == 3
    assert set(HotspotEvent.objects.values_list("event_id", flat=True)) == {e.id for e in events}


def test_metrics_fold_into_minute_rollups_once(redis_client, cluster, cluster_router):
    start = 1_800_000_000.0  # a minute boundary
    record = MetricsRecord(
        id="m-1",
        cluster="ops-test",
        router="r0",
        start=start,
        end=start + 1,
        arms={
            "baseline": ArmMetrics(
                policy="lmetric",
                requests=3,
                errors=1,
                output_tokens=30,
                hotspot_fallbacks=2,
                ttft_s=[0.1, 0.2, 0.3],
                tpot_s=[0.01, 0.02],
            )
        },
    )
    second = record.model_copy(update={"id": "m-2", "start": start + 1, "end": start + 2})
    for entry in (record, record, second):
        redis_client.xadd(METRICS_STREAM, entry.to_stream_fields())
    result = ingest.ingest_metrics(redis_client)
    assert (result.stored, result.duplicates) == (2, 1)
    assert redis_client.xlen(METRICS_STREAM) == 0  # folded entries do not accumulate
    row = ArmMetricRollup.objects.get(cluster=cluster, arm="baseline")
    assert (row.requests, row.errors, row.output_tokens, row.hotspot_fallbacks) == (6, 2, 60, 4)
    assert sorted(row.ttft_samples) == [0.1, 0.1, 0.2, 0.2, 0.3, 0.3]
    assert row.ttft_p50_s == pytest.approx(0.2)


def test_flow_refusals_are_summarised_in_the_audit_once_per_event(redis_client, cluster):
    from controlplane.models import AuditEvent

    summary = EventRecord.new(
        "ops-test",
        "r0",
        "flow_refusals",
        time.time(),
        interval_s=60.0,
        tenants={"batch": {"shed": 120, "quota": 3}, "team-a": {"queue_timeout": 2}},
    )
    bad = EventRecord.new("ops-test", "r0", "flow_refusals", time.time(), tenants=["x"])
    for event in (summary, summary, bad):  # redelivered once, and one malformed
        redis_client.xadd(EVENTS_STREAM, event.to_stream_fields())
    result = ingest.ingest_events(redis_client)
    assert (result.stored, result.duplicates) == (1, 1)
    rows = AuditEvent.objects.filter(action="flow.refusals")
    assert rows.count() == 1
    row = rows.get()
    assert row.actor_name == "system:router:r0" and row.cluster_id == cluster.pk
    assert "batch: 123" in row.reason and "team-a: 2" in row.reason
    assert row.after is not None and row.after["tenants"]["batch"]["shed"] == 120
