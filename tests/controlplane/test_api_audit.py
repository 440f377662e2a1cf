"""Every mutating endpoint writes exactly one audit row with before/after and the reason;
reads and router heartbeats write none."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.test import Client

from controlplane.models import AuditEvent

from .endpoints import READS, REASON, ROUTER_AGENT, WRITES, call
from .helpers import session_client

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("endpoint", WRITES, ids=lambda e: e.id)
def test_mutation_writes_exactly_one_audit_row(world, users, replay_dispatches, endpoint) -> None:
    newest_before = AuditEvent.objects.order_by("-id").values_list("id", flat=True).first()
    response = call(
        session_client(users["admin"]), endpoint, world.ids, **{"X-Request-ID": "req-123"}
    )
    assert response.status_code == endpoint.success, response.content
    rows = list(AuditEvent.objects.filter(id__gt=newest_before))
    assert len(rows) == 1, [row.action for row in rows]
    row = rows[0]
    assert row.action == endpoint.audit_action
    assert row.reason == REASON["reason"]
    assert row.actor == users["admin"] and row.actor_name == users["admin"].username
    assert row.request_id == "req-123"
    assert row.after is not None
    if endpoint.updates:
        assert row.before is not None and row.before != row.after
    else:
        assert row.before is None


@pytest.mark.parametrize(
    "endpoint", [e for e in WRITES if e.min_role != "viewer"], ids=lambda e: e.id
)
def test_refused_mutation_writes_no_audit_row(world, users, endpoint) -> None:
    count = AuditEvent.objects.count()
    response = call(session_client(users["viewer"]), endpoint, world.ids)
    assert response.status_code == 403
    assert AuditEvent.objects.count() == count


def test_reads_and_heartbeats_write_no_audit_row_but_downloads_do(world, users) -> None:
    """A read leaves no trace in the audit log; a download of captured traffic (the
    trace of a capture: who took a copy of the cluster's traffic) does, one row each."""
    count = AuditEvent.objects.count()
    downloads = [e for e in READS if e.path.endswith("/trace")]
    assert downloads  # the capture trace is among the reads
    for endpoint in READS:
        response = call(session_client(users["viewer"]), endpoint, world.ids)
        assert response.status_code == 200
        if response.streaming:
            drain(response)
    router = Client(headers={"Authorization": f"Bearer {world.router_token}"})
    for endpoint in ROUTER_AGENT:
        assert call(router, endpoint, world.ids).status_code == 200
    written = AuditEvent.objects.order_by("pk")[count:]
    assert [e.action for e in written] == ["capture.download"] * len(downloads)


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/instances/{i0}/drain",
        "/api/v1/clusters/{alpha}/policies/{ll}/activate",
        "/api/v1/canaries/{draft}/start",
    ],
)
@pytest.mark.parametrize("reason", ["", "   "])
def test_routing_changes_need_a_reason(world, users, path: str, reason: str) -> None:
    count = AuditEvent.objects.count()
    response = session_client(users["admin"]).post(
        path.format(**world.ids), {"reason": reason}, content_type="application/json"
    )
    assert response.status_code == 400
    assert response.json()["error"]["field"] == "reason"
    assert AuditEvent.objects.count() == count


def test_delete_takes_the_reason_from_a_json_body(world, users) -> None:
    response = session_client(users["admin"]).delete(
        f"/api/v1/instances/{world['spare']}",
        {"reason": "decommissioned"},
        content_type="application/json",
    )
    assert response.status_code == 204
    row = AuditEvent.objects.latest("id")
    assert (row.action, row.reason) == ("instance.remove", "decommissioned")


def test_audit_events_endpoint_filters_by_action_and_actor(world, users) -> None:
    client = session_client(users["admin"])
    client.post(f"/api/v1/instances/{world['i0']}/drain", REASON, content_type="application/json")
    page = client.get("/api/v1/audit-events", {"actor": users["admin"].username}).json()
    assert page["count"] == 1
    assert page["items"][0]["action"] == "instance.drain"
    assert page["items"][0]["before"]["state"] == "enabled"
    assert page["items"][0]["after"]["state"] == "draining"
    assert client.get("/api/v1/audit-events", {"action": "nope"}).json()["count"] == 0


def drain(response: Any) -> None:
    """Read a streamed answer to its end (an async one as ASGI would)."""
    if not response.is_async:
        b"".join(response.streaming_content)
        return

    async def read() -> None:
        async for _ in response.streaming_content:
            pass

    async_to_sync(read)()
