"""Operators see how many telemetry entries were quarantined, and each one as it was sent."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from controlplane.services import ingest
from router_worker.contract.telemetry import EVENTS_STREAM

pytestmark = pytest.mark.django_db(transaction=True)
KEYS = (EVENTS_STREAM, ingest.QUARANTINE_STREAM, ingest.QUARANTINE_COUNTS)


@pytest.fixture
def streams(redis_client: redis.Redis) -> Iterator[redis.Redis]:
    redis_client.delete(*KEYS)
    yield redis_client
    redis_client.delete(*KEYS)


def test_hotspot_log_counts_and_the_quarantine_page_shows_each_entry(streams, cluster, as_role):
    hostile_router = "<script>alert(1)</script>" * 4  # over 64 characters, and hostile
    event = {
        "id": uuid.uuid4().hex,
        "cluster": cluster.name,
        "router": hostile_router,
        "kind": "health",
        "at": time.time(),
        "payload": {},
    }
    streams.xadd(EVENTS_STREAM, {"data": json.dumps(event)})
    streams.xadd(EVENTS_STREAM, {"data": "{not json"})
    assert ingest.ingest_events(streams).quarantined == 2
    viewer = as_role("viewer")
    log = viewer.get("/hotspots/").content.decode()
    assert "2 telemetry entries quarantined" in log and 'href="/telemetry/quarantine/"' in log
    response = viewer.get("/telemetry/quarantine/")
    body = response.content.decode()
    assert response.status_code == 200
    assert "{not json" in body and "router: String should have at most 64 characters" in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body and "<script>alert" not in body


def test_the_api_lists_the_quarantine_newest_first(streams, cluster, as_role):
    streams.xadd(EVENTS_STREAM, {"data": "{not json"})
    streams.xadd(EVENTS_STREAM, {"data": json.dumps({"id": "x", "cluster": cluster.name})})
    ingest.ingest_events(streams)
    response = as_role("viewer").get("/api/v1/telemetry-quarantine", {"limit": 1})
    assert response.status_code == 200
    body = response.json()
    assert (body["total"], body["counts"]) == (2, {EVENTS_STREAM: 2})
    [entry] = body["entries"]
    assert entry["source"] == EVENTS_STREAM and entry["data"].startswith('{"id": "x"')
    assert "router: Field required" in entry["reason"]


def test_forged_quarantine_entries_and_counts_leave_the_pages_up(streams, as_role):
    streams.hset(ingest.QUARANTINE_COUNTS, mapping={EVENTS_STREAM: 2, "forged": "lots"})
    streams.xadd(ingest.QUARANTINE_STREAM, {"at": "inf", "data_bytes": "many", "data": "a"})
    streams.xadd(ingest.QUARANTINE_STREAM, {"at": "1e30", "reason": "r" * 100_000})
    streams.xadd(ingest.QUARANTINE_STREAM, {"junk": "\xff", "data": "d" * 1_000_000})
    viewer = as_role("viewer")
    assert "2 telemetry entries quarantined" in viewer.get("/hotspots/").content.decode()
    page = viewer.get("/telemetry/quarantine/")
    assert page.status_code == 200 and len(page.content) < 200_000
    response = viewer.get("/api/v1/telemetry-quarantine")
    assert response.status_code == 200
    body = response.json()
    assert body["counts"] == {EVENTS_STREAM: 2, "forged": 0} and len(body["entries"]) == 3
    assert body["entries"][0]["data_bytes"] == ingest.QUARANTINED_DATA_BYTES
