"""Traffic captures in the control plane: start and stop through config versions, the
routers' batches ingested (idempotent, bounded, hostile entries quarantined), the limits,
and the export as a trace the simulator reads."""

from __future__ import annotations

import json
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone

from controlplane.models import AuditEvent, CapturedRequest, TrafficCapture
from controlplane.selectors import captures as capture_reads
from controlplane.services import captures, config, ingest
from controlplane.services.audit import Actor
from controlplane.services.errors import Conflict, Invalid, ServiceError
from enginesim.replay.traces import read_trace
from router_worker.contract.telemetry import CaptureBatch, capture_stream, encode_block_hashes
from router_worker.contract.telemetry import CaptureRecord as Wire

pytestmark = pytest.mark.django_db(transaction=True)
OPERATOR = Actor(name="operator")


@pytest.fixture
def streams(redis_client):
    redis_client.delete(capture_stream("ops-test"))
    yield redis_client
    redis_client.delete(capture_stream("ops-test"))


@pytest.fixture
def routed(cluster, cluster_router):
    """The cluster with an instance and an active policy: it has a router config."""
    from controlplane.models import Policy

    cluster.instances.create(name="i0", url="http://127.0.0.1:9")
    cluster.active_policy = Policy.objects.create(cluster=cluster, name="rr", kind="round_robin")
    cluster.save()
    return cluster


def routed_document(cluster) -> dict:
    version = config.latest_version(cluster)
    assert version is not None
    return version.document


def wire(at: float, session: str | None = None, ids: tuple[int, ...] = (1, 2), **extra) -> Wire:
    fields: dict[str, Any] = {
        "prompt_tokens": 40,
        "output_tokens": 8,
        "block_size": 16,
        "status": 200,
    }
    fields = {"block_hashes": encode_block_hashes(ids)} | fields | extra
    return Wire(at=at, session=session, instance="i0", **fields)


def send(
    client,
    capture: TrafficCapture,
    requests: list[Wire],
    router: str = "r0",
    max_model_len: int | None = None,
) -> str:
    batch = CaptureBatch(
        id=uuid.uuid4().hex,
        cluster="ops-test",
        router=router,
        capture=capture.pk,
        requests=requests,
        max_model_len=max_model_len,
    )
    client.xadd(capture_stream("ops-test"), batch.to_stream_fields())
    return batch.id


def test_a_capture_starts_and_stops_through_config_versions_and_is_audited(routed):
    capture = captures.start_capture(OPERATOR, routed.pk, name="monday peak", max_requests=50)
    document = routed_document(routed)
    assert document["capture"] == {"id": capture.pk, "salt": capture.salt}
    assert len(capture.salt) == 64
    with pytest.raises(Conflict, match="already capturing"):
        captures.start_capture(OPERATOR, routed.pk, name="another")
    captures.stop_capture(OPERATOR, routed.pk, capture.pk, reason="enough")
    assert "capture" not in routed_document(routed)
    capture.refresh_from_db()
    assert capture.state == "stopped" and capture.stop_reason == "stopped by operator"
    actions = list(AuditEvent.objects.order_by("pk").values_list("action", flat=True))
    assert actions[-2:] == ["capture.start", "capture.stop"]
    assert all(capture.salt not in str(e.after) for e in AuditEvent.objects.all())
    with pytest.raises(Conflict, match="already stopped"):
        captures.stop_capture(OPERATOR, routed.pk, capture.pk)


def test_bad_capture_settings_are_refused_together(routed):
    with pytest.raises(Invalid) as refused:
        captures.start_capture(OPERATOR, routed.pk, name=" ", max_requests=0, max_minutes="ten")
    fields = {p["field"] for p in refused.value.details["problems"]}
    assert fields == {"name", "max_requests", "max_minutes"}
    with pytest.raises(ServiceError, match="printable"):
        captures.start_capture(OPERATOR, routed.pk, name="bad\x00name")
    assert not TrafficCapture.objects.exists()


def test_batches_are_stored_once_and_hostile_entries_quarantined(routed, streams):
    capture = captures.start_capture(OPERATOR, routed.pk, name="c")
    now = time.time()
    first = send(streams, capture, [wire(now, "s1"), wire(now + 1, "s1")])
    batch = CaptureBatch(
        id=first, cluster="ops-test", router="r0", capture=capture.pk, requests=[wire(now)]
    )
    streams.xadd(capture_stream("ops-test"), batch.to_stream_fields())  # delivered again
    send(streams, capture, [wire(now, prompt_tokens=-5)])
    send(streams, capture, [wire(now, block_hashes="not base64!")])
    send(streams, capture, [wire(now, ttft_s=1e9)])
    send(streams, capture, [wire(now)], router="stranger")
    streams.xadd(capture_stream("ops-test"), {"data": "{not json"})
    result = ingest.ingest_captures(streams)
    # a request the rows cannot hold is dropped and counted, never its whole batch
    assert (result.stored, result.duplicates, result.quarantined) == (4, 1, 2)
    capture.refresh_from_db()
    assert capture.requests == 2 == CapturedRequest.objects.filter(capture=capture).count()
    assert capture.dropped == 3
    assert streams.xlen(capture_stream("ops-test")) == 0  # stored entries are deleted


def test_a_capture_stops_itself_at_its_request_limit(routed, streams):
    capture = captures.start_capture(OPERATOR, routed.pk, name="small", max_requests=3)
    now = time.time()
    send(streams, capture, [wire(now + k) for k in range(5)])
    ingest.ingest_captures(streams)
    capture.refresh_from_db()
    assert (capture.state, capture.requests, capture.dropped) == ("stopped", 3, 2)
    assert capture.stop_reason == "reached its limit of 3 requests"
    assert "capture" not in routed_document(routed)
    stop = AuditEvent.objects.get(action="capture.stop")
    assert stop.actor_name == "system:capture"


def test_requests_after_the_stop_are_dropped_and_the_age_limits_hold(routed, streams):
    capture = captures.start_capture(OPERATOR, routed.pk, name="c", max_minutes=1)
    assert captures.enforce_limits() == {"stopped": 0, "deleted": 0}
    later = timezone.now() + timedelta(minutes=1, seconds=1)
    assert captures.enforce_limits(later)["stopped"] == 1
    capture.refresh_from_db()
    assert capture.stop_reason == "reached its limit of 1 minutes"
    assert capture.stopped_at is not None
    stopped = capture.stopped_at.timestamp()
    send(streams, capture, [wire(stopped - 0.5), wire(stopped + 5)])
    ingest.ingest_captures(streams)
    capture.refresh_from_db()
    assert (capture.requests, capture.dropped) == (1, 1)
    # kept for SWITCHYARD_CAPTURE_RETENTION_DAYS (30) days after its stop, to the second
    assert settings.SWITCHYARD_CAPTURE_RETENTION_DAYS == 30  # the README's default
    for age in (timedelta(days=29), timedelta(days=30) - timedelta(seconds=1)):
        assert captures.enforce_limits(capture.stopped_at + age)["deleted"] == 0, age
    assert TrafficCapture.objects.filter(pk=capture.pk).exists()
    past_retention = capture.stopped_at + timedelta(days=30, seconds=1)
    assert captures.enforce_limits(past_retention)["deleted"] == 1
    assert not TrafficCapture.objects.exists() and not CapturedRequest.objects.exists()


def test_a_capture_started_without_limits_gets_the_readme_defaults(routed):
    """60 minutes and 100,000 requests unless the operator asks otherwise."""
    capture = captures.start_capture(OPERATOR, routed.pk, name="defaults")
    assert (capture.max_requests, capture.max_duration_s) == (100_000, 60 * 60)
    assert captures.enforce_limits(capture.started_at + timedelta(minutes=59, seconds=59)) == {
        "stopped": 0,
        "deleted": 0,
    }
    assert captures.enforce_limits(capture.started_at + timedelta(minutes=60))["stopped"] == 1
    capture.refresh_from_db()
    assert capture.stop_reason == "reached its limit of 60 minutes"


def test_the_export_merges_routers_in_arrival_order_and_chains_sessions(
    routed, streams, tmp_path, settings
):
    from controlplane.models import RouterDeployment

    RouterDeployment.objects.create(cluster=routed, name="r1", host="ops", port=2)
    settings.SWITCHYARD_VAR_DIR = str(tmp_path)
    capture = captures.start_capture(OPERATOR, routed.pk, name="c")
    t0 = time.time()
    send(streams, capture, [wire(t0, "a", (5, 6)), wire(t0 + 2, "a", (5, 6, 7))], "r0", 131072)
    send(streams, capture, [wire(t0 + 1, "b", (9,)), wire(t0 + 3, None, (5,))], "r1", 65536)
    ingest.ingest_captures(streams)
    capture.refresh_from_db()
    assert capture.max_model_len == 65536  # the smaller engine's, which refuses more
    assert capture_reads.replay_max_model_len(capture.trace) == 65536
    path = captures.export_for_replay(routed.pk, capture.pk)
    records = read_trace(path)
    assert [r.arrival_s for r in records] == [0.0, 1.0, 2.0, 3.0]
    ids = [r.hash_ids for r in records]  # keyed digests of the routers' block hashes
    assert [len(i) for i in ids] == [2, 1, 3, 1]
    assert ids[2][:2] == ids[0] and ids[3][0] == ids[0][0] != ids[1][0]
    assert not {5, 6, 7, 9} & {h for i in ids for h in i}
    assert all(0 <= h < 2**63 for i in ids for h in i)
    assert records[0].session_id == records[2].session_id != records[1].session_id
    assert [r.turn for r in records[:3]] == [0, 0, 1]
    assert records[0].block_size == 16


def test_two_captures_of_the_same_prompts_share_no_id(routed, streams):
    first = captures.start_capture(OPERATOR, routed.pk, name="one")
    send(streams, first, [wire(time.time(), "s", (11, 12, 13))])
    ingest.ingest_captures(streams)
    captures.stop_capture(OPERATOR, routed.pk, first.pk)
    second = captures.start_capture(OPERATOR, routed.pk, name="two")
    send(streams, second, [wire(time.time(), "s", (11, 12, 13))])
    ingest.ingest_captures(streams)
    one, two = (CapturedRequest.objects.get(capture=c).hash_ids for c in (first, second))
    assert len(one) == len(two) == 3 and not set(one) & set(two)


def test_rename_and_delete_are_audited_and_delete_stops_a_running_capture(routed):
    capture = captures.start_capture(OPERATOR, routed.pk, name="old")
    captures.rename_capture(OPERATOR, routed.pk, capture.pk, name="new name")
    captures.delete_capture(OPERATOR, routed.pk, capture.pk, reason="done")
    assert not TrafficCapture.objects.exists()
    assert "capture" not in routed_document(routed)
    actions = list(AuditEvent.objects.order_by("pk").values_list("action", flat=True))
    assert actions[-3:] == ["capture.start", "capture.rename", "capture.delete"]
    deleted = AuditEvent.objects.get(action="capture.delete")
    assert deleted.before is not None and deleted.before["state"] == "capturing"
    with pytest.raises(ServiceError, match="does not exist"):
        captures.rename_capture(OPERATOR, routed.pk, capture.pk, name="x")


def test_the_demo_captures_its_own_traffic_from_the_start(db):
    from controlplane.services import demo

    spec = demo.DemoSpec(
        cluster="demo-capture", instances=2, kv_events_base_port=None, time_scale=2.0
    )
    cluster = demo.seed(spec)
    demo.seed(spec)  # seeding again keeps the running capture
    running = TrafficCapture.objects.get(cluster=cluster)
    assert (running.name, running.state) == ("demo traffic", "capturing")
    assert running.engine_time_scale == 2.0
    assert routed_document(cluster)["capture"]["id"] == running.pk


def test_the_export_and_the_live_latencies_are_in_the_engines_time(routed, streams):
    capture = captures.start_capture(OPERATOR, routed.pk, name="slow", engine_time_scale="2")
    t0 = time.time()
    send(
        streams,
        capture,
        [
            wire(t0, ttft_s=0.4, tpot_s=0.04),
            wire(t0 + 4, ttft_s=0.8, tpot_s=0.08),
            wire(t0 + 6, status=500),
        ],
    )
    ingest.ingest_captures(streams)
    rows = [json.loads(line) for line in captures.export_lines(capture)]
    assert [r["timestamp"] for r in rows] == [0.0, 2.0, 3.0]  # wall seconds ÷ 2
    assert [r["ttft_s"] for r in rows] == [0.2, 0.4, None]
    live = capture_reads.live_latencies(capture.pk, None)
    assert live is not None and (live["requests"], live["measured"]) == (3, 2)
    assert live["ttft_mean_s"] == pytest.approx(0.3) and live["tpot_mean_s"] == pytest.approx(0.03)
    assert capture_reads.live_latencies(capture.pk, 1)["measured"] == 1  # type: ignore[index]
    with pytest.raises(ServiceError, match="engine_time_scale"):
        captures.start_capture(OPERATOR, routed.pk, name="x", engine_time_scale="fast")


def test_a_capture_records_each_requests_tenant_as_a_keyed_digest_and_its_class(
    routed, streams, tmp_path, settings
):
    from router_worker.contract.capture import CaptureKey

    settings.SWITCHYARD_VAR_DIR = str(tmp_path)
    capture = captures.start_capture(OPERATOR, routed.pk, name="tenants")
    key = CaptureKey(capture.salt)
    team, other = key.tenant("team-a"), CaptureKey("another-salt-0123456789").tenant("team-a")
    assert team != other and "team" not in team and len(team) == 16
    assert key.tenant("default") == "default"
    t0 = time.time()
    rows = [
        wire(t0, tenant=team, priority="critical"),
        wire(t0 + 1, tenant="default", priority="sheddable"),
        wire(t0 + 2),  # a router older than the fields
    ]
    send(streams, capture, rows)
    hostile = wire(t0 + 3, tenant="../x", priority="vip")
    send(streams, capture, [hostile])
    ingest.ingest_captures(streams)
    assert CapturedRequest.objects.filter(capture=capture).count() == 3  # the hostile one: no
    records = read_trace(captures.export_for_replay(routed.pk, capture.pk))
    assert [(r.tenant, r.priority) for r in records] == [
        (team, "critical"),
        ("default", "sheddable"),
        (None, None),
    ]
