"""Config versions: monotonic per cluster, immutable, announced on Redis after commit, and
served to routers with their own token."""

from __future__ import annotations

import json

import pytest
import redis
from django.conf import settings
from django.test import Client

from controlplane.models import ConfigVersion
from controlplane.services import policies
from router_worker.contract.telemetry import CONFIG_CHANNEL

from .endpoints import REASON
from .helpers import SYSTEM, session_client


def versions_of(cluster_id: int) -> list[int]:
    return list(
        ConfigVersion.objects.filter(cluster_id=cluster_id)
        .order_by("number")
        .values_list("number", flat=True)
    )


@pytest.mark.django_db
def test_each_routing_change_adds_the_next_number(world, users) -> None:
    client = session_client(users["admin"])
    before = versions_of(world["alpha"])
    assert before == list(range(1, len(before) + 1))
    for path in (
        "/api/v1/instances/{i0}/drain",
        "/api/v1/instances/{i0}/enable",
        "/api/v1/clusters/{alpha}/policies/{ll}/activate",
    ):
        response = client.post(path.format(**world.ids), REASON, content_type="application/json")
        assert response.status_code == 200, response.content
    after = versions_of(world["alpha"])
    assert after == [*before, len(before) + 1, len(before) + 2, len(before) + 3]
    listed = client.get(f"/api/v1/clusters/{world['alpha']}/config-versions").json()
    assert [v["number"] for v in listed] == after[::-1]
    newest = client.get(f"/api/v1/clusters/{world['alpha']}/config-versions/{after[-1]}").json()
    assert newest["document"]["version"] == after[-1]
    assert newest["document"]["policy"]["kind"] == "least_load"
    assert newest["reason"] == REASON["reason"] and newest["created_by"] == "user-admin"


@pytest.mark.django_db
def test_changes_that_do_not_affect_routing_add_no_version(world, users) -> None:
    before = versions_of(world["alpha"])
    response = session_client(users["admin"]).post(
        f"/api/v1/clusters/{world['alpha']}/policies",
        {"name": "spare-policy", "kind": "round_robin", "reason": "later"},
        content_type="application/json",
    )
    assert response.status_code == 201
    assert versions_of(world["alpha"]) == before


@pytest.mark.django_db
def test_old_versions_are_immutable(world) -> None:
    first = ConfigVersion.objects.get(cluster_id=world["alpha"], number=1)
    original = first.document
    first.document = {**original, "policy": {"kind": "round_robin", "params": {}}}
    with pytest.raises(ValueError, match="immutable"):
        first.save()
    policies.activate_policy(SYSTEM, world["alpha"], world["ll"], reason="move on")
    assert ConfigVersion.objects.get(pk=first.pk).document == original


@pytest.mark.django_db
def test_unknown_version_number_is_404(world, users) -> None:
    response = session_client(users["viewer"]).get(
        f"/api/v1/clusters/{world['alpha']}/config-versions/999"
    )
    assert response.status_code == 404
    assert "no config version 999" in response.json()["error"]["message"]


@pytest.mark.django_db
def test_activation_publishes_the_new_number_on_redis_after_commit(
    world, users, django_capture_on_commit_callbacks
) -> None:
    subscriber = redis.Redis.from_url(settings.REDIS_URL)
    pubsub = subscriber.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(CONFIG_CHANNEL)
    try:
        newest = versions_of(world["alpha"])[-1]
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            response = session_client(users["operator"]).post(
                f"/api/v1/clusters/{world['alpha']}/policies/{world['ll']}/activate",
                REASON,
                content_type="application/json",
            )
            assert response.status_code == 200
        assert pubsub.get_message(timeout=0.2) is None  # nothing before the commit
        for callback in callbacks:
            callback()
        message = pubsub.get_message(timeout=5)
    finally:
        pubsub.close()
        subscriber.close()
    assert message is not None
    assert json.loads(message["data"]) == {"cluster": "alpha", "version": newest + 1}


@pytest.mark.django_db
def test_router_fetches_the_current_document_and_reports_it_applied(world, users) -> None:
    router = Client(headers={"Authorization": f"Bearer {world.router_token}"})
    newest = ConfigVersion.objects.filter(cluster_id=world["alpha"]).latest("number")
    config = router.get(f"/api/v1/routers/{world['router']}/config")
    assert config.status_code == 200
    assert config.json() == {"version": newest.number, "document": newest.document}
    unchanged = router.get(
        f"/api/v1/routers/{world['router']}/config", headers={"If-None-Match": config["ETag"]}
    )
    assert unchanged.status_code == 304

    beat = router.post(
        f"/api/v1/routers/{world['router']}/heartbeat",
        {"applied_version": newest.number, "state": {"inflight": 3}},
        content_type="application/json",
    )
    assert beat.json() == {
        "applied_version": newest.number,
        "current_version": newest.number,
        "is_current": True,
    }
    policies.activate_policy(SYSTEM, world["alpha"], world["ll"], reason="newer")
    listed = session_client(users["viewer"]).get(f"/api/v1/routers/{world['router']}").json()
    assert listed["applied_version"] == newest.number
    assert listed["current_version"] == newest.number + 1 and listed["is_current"] is False
    assert listed["heartbeat"] == {"inflight": 3} and listed["last_heartbeat"]


@pytest.mark.django_db
def test_heartbeat_with_a_version_that_does_not_exist_is_refused(world) -> None:
    router = Client(headers={"Authorization": f"Bearer {world.router_token}"})
    response = router.post(
        f"/api/v1/routers/{world['router']}/heartbeat",
        {"applied_version": 999},
        content_type="application/json",
    )
    assert response.status_code == 400
    assert response.json()["error"]["field"] == "applied_version"
