"""Replay jobs reach the broker by task name (or stay queued, saying so); API tokens are
shown once, stored hashed, and usable right away; router tokens likewise."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
import redis
from django.conf import settings
from django.core.management import CommandError, call_command
from django.test import Client
from kombu.exceptions import OperationalError as BrokerDown

from controlplane.models import ApiToken, AuditEvent, ReplayJob, RouterDeployment
from controlplane.services.bearer import sha256_hex
from controlplane.services.replays import CELL_TASK
from tests.broker import queue_key

from .helpers import session_client

pytestmark = pytest.mark.django_db
REPLAY = {
    "trace": "shared:mooncake_synthetic_trace.jsonl",
    "policies": [{"kind": "lmetric"}],
    "rate_scale": 2.0,
    "reason": "what if",
}


def request_replay(client, world):
    return client.post(
        f"/api/v1/clusters/{world['alpha']}/replays", REPLAY, content_type="application/json"
    )


def test_replay_is_created_queued_and_sent_by_task_name(world, users, replay_dispatches) -> None:
    response = request_replay(session_client(users["operator"]), world)
    assert response.status_code == 202
    body = response.json()
    job = ReplayJob.objects.get(pk=body["replay"]["id"])
    assert job.state == "queued" and job.created_by == users["operator"]
    assert job.inputs["policies"][0]["params"]["hotspot"]["enabled"] is True  # defaults filled
    assert body["dispatched"] is True
    cells = list(job.cells.values_list("pk", flat=True))
    assert len(cells) == 1  # one policy, one load, one seed
    assert [(name, args[0]) for name, args, _ in replay_dispatches] == [(CELL_TASK, (cells[0],))]
    # a plain group, no chord: the last cell to end ends the job, so no chord state (which
    # Celery's backend expires) stands between the cells and the job's end
    assert "chord" not in replay_dispatches[0][2]


def test_a_replay_request_is_refused_with_every_problem_at_once(
    world, users, replay_dispatches
) -> None:
    body = {
        **REPLAY,
        "trace": "shared:no-such-trace.jsonl",
        "policies": [
            {"kind": "lmetric"},
            {"kind": "no_such_policy"},
            {"kind": "linear", "params": {"w": 7, "cost_p": -1}},
        ],
    }
    jobs_before = ReplayJob.objects.count()
    response = session_client(users["operator"]).post(
        f"/api/v1/clusters/{world['alpha']}/replays", body, content_type="application/json"
    )
    assert response.status_code == 400
    error = response.json()["error"]
    fields = [problem["field"] for problem in error["problems"]]
    assert fields[:2] == ["trace", "policies.1.kind"]
    assert "policies.2.params.w" in fields and len(fields) >= 3
    assert error["field"] == "trace" and "no-such-trace" in error["message"]
    assert ReplayJob.objects.count() == jobs_before and replay_dispatches == []


def test_replay_survives_a_broker_outage_and_says_so(world, users, monkeypatch) -> None:
    from controlplane.celery import app

    def broker_down(*args, **kwargs):
        raise BrokerDown("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(app, "send_task", broker_down)
    response = request_replay(session_client(users["operator"]), world)
    assert response.status_code == 202
    body = response.json()
    assert body["dispatched"] is False
    assert "broker is unreachable" in body["message"] and "queued" in body["message"]
    assert ReplayJob.objects.get(pk=body["replay"]["id"]).state == "queued"


def test_replay_task_message_lands_in_the_real_broker(world, users) -> None:
    response = request_replay(session_client(users["operator"]), world)
    job_id = response.json()["replay"]["id"]
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    try:
        queued = [
            m
            for m in client.lrange(queue_key("replays"), 0, -1)
            if json.loads(m)["headers"].get("task") == CELL_TASK
        ]
        for message in queued:  # leave nothing for a worker of another test to pick up
            client.lrem(queue_key("replays"), 0, message)  # type: ignore[arg-type]  # stub: a str value only
    finally:
        client.close()
    cell = ReplayJob.objects.get(pk=job_id).cells.get()
    ours = [m for m in queued if json.loads(m)["headers"]["argsrepr"] == f"({cell.pk},)"]
    assert len(ours) == 1  # (other runs may have left messages of their own jobs)


def test_replay_list_filters_by_cluster_and_state(world, users, replay_dispatches) -> None:
    viewer = session_client(users["viewer"])
    request_replay(session_client(users["operator"]), world)
    assert len(viewer.get("/api/v1/replays", {"cluster": world["alpha"]}).json()) == 2
    assert viewer.get("/api/v1/replays", {"cluster": world["beta"]}).json() == []
    assert viewer.get("/api/v1/replays", {"state": "succeeded"}).json() == []


def test_create_api_token_command_prints_a_working_token_once(world, users) -> None:
    out = StringIO()
    call_command("create_api_token", users["operator"].username, "ci", stdout=out)
    plaintext = out.getvalue().strip()
    assert plaintext.startswith("sy_")
    stored = ApiToken.objects.get(user=users["operator"], name="ci")
    assert stored.token_hash == sha256_hex(plaintext) and plaintext not in stored.token_hash
    audit_rows = AuditEvent.objects.filter(action="api_token.create", target_id=str(stored.pk))
    assert audit_rows.count() == 1
    me = Client(headers={"Authorization": f"Bearer {plaintext}"}).get("/api/v1/me")
    assert me.json() == {"username": users["operator"].username, "role": "operator"}
    stored.refresh_from_db()
    assert stored.last_used_at is not None


def test_create_api_token_command_refuses_an_unknown_user(world) -> None:
    with pytest.raises(CommandError, match="no user named"):
        call_command("create_api_token", "ghost", "ci")


def test_router_creation_returns_a_token_once_and_stores_only_its_hash(world, users) -> None:
    response = session_client(users["admin"]).post(
        f"/api/v1/clusters/{world['alpha']}/routers",
        {"name": "r7", "host": "10.0.0.7", "port": 8107, "reason": "new host"},
        content_type="application/json",
    )
    assert response.status_code == 201
    token = response.json()["token"]
    router_id = response.json()["router"]["id"]
    assert RouterDeployment.objects.get(pk=router_id).token_hash == sha256_hex(token)
    fetched = session_client(users["admin"]).get(f"/api/v1/routers/{router_id}").json()
    assert "token" not in fetched and "token_hash" not in fetched
    config = Client(headers={"Authorization": f"Bearer {token}"}).get(
        f"/api/v1/routers/{router_id}/config"
    )
    assert config.status_code == 200 and config.json()["document"]["cluster"] == "alpha"


def test_a_replay_asks_for_flow_control_and_tenant_scales_by_the_api(
    world, users, replay_dispatches
) -> None:
    client = session_client(users["operator"])
    url = f"/api/v1/clusters/{world['alpha']}/replays"
    jobs_before = ReplayJob.objects.count()
    hostile: list[tuple[dict[str, Any], str]] = [
        ({"flow": "sometimes"}, "flow"),
        ({"tenant_scales": {"nobody": 2}}, "tenant_scales"),
        ({"tenant_scales": {"default": 11}}, "tenant_scales"),
        ({"tenant_scales": {"default": -1}}, "tenant_scales"),
    ]
    for bad, field in hostile:
        refused = client.post(url, {**REPLAY, **bad}, content_type="application/json")
        assert refused.status_code in (400, 422), bad
        assert field in json.dumps(refused.json()), bad
    assert ReplayJob.objects.count() == jobs_before
    body = {**REPLAY, "flow": "on", "tenant_scales": {"default": 2}}
    created = client.post(url, body, content_type="application/json")
    assert created.status_code == 202, created.content
    job = ReplayJob.objects.get(pk=created.json()["replay"]["id"])
    assert (job.inputs["flow"], job.inputs["tenant_scales"]) == ("on", {"default": 2.0})
