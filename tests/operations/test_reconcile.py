"""Reconcile compares desired state with heartbeats; running it twice acts once."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.models import RouterDeployment
from controlplane.services import clusters, policies, reconcile
from controlplane.services.audit import Actor
from router_worker.telemetry_contract import CONFIG_CHANNEL

pytestmark = pytest.mark.django_db(transaction=True)
ADMIN = Actor.system("test")


@pytest.fixture
def routed_cluster(db):
    cluster = clusters.create_cluster(ADMIN, name="rec", model="m", gpu_type="h20")
    clusters.add_instance(ADMIN, cluster.pk, name="i0", url="http://127.0.0.1:9100", reason="x")
    policy = policies.create_policy(ADMIN, cluster.pk, name="lm", kind="lmetric")
    policies.activate_policy(ADMIN, cluster.pk, policy.pk, reason="x")
    return cluster


def router(
    cluster, name: str, port: int, heartbeat_age_s: float | None, applied: int | None
) -> RouterDeployment:
    beat = None if heartbeat_age_s is None else timezone.now() - timedelta(seconds=heartbeat_age_s)
    return RouterDeployment.objects.create(
        cluster=cluster,
        name=name,
        host="host-a",
        port=port,
        last_heartbeat=beat,
        applied_version=applied,
    )


def test_silent_router_is_restarted_once(routed_cluster, redis_client):
    router(routed_cluster, "r-silent", 8001, heartbeat_age_s=120, applied=1)
    router(routed_cluster, "r-fine", 8002, heartbeat_age_s=1, applied=1)
    listening = time.time() - 60  # the control plane has been listening for a minute
    first = reconcile.reconcile_cluster(routed_cluster, redis_client, listening=listening)
    second = reconcile.reconcile_cluster(routed_cluster, redis_client, listening=listening)
    assert first.actions == ["restart r-silent"]
    assert second.actions == []


def test_router_behind_on_config_gets_the_version_announced_once(routed_cluster, redis_client):
    router(routed_cluster, "r-old", 8003, heartbeat_age_s=1, applied=None)
    pubsub = redis_client.pubsub()
    pubsub.subscribe(CONFIG_CHANNEL)
    pubsub.get_message(timeout=1)  # subscription confirmation
    assert reconcile.reconcile_cluster(routed_cluster, redis_client).actions == ["push r-old"]
    assert reconcile.reconcile_cluster(routed_cluster, redis_client).actions == []
    message = pubsub.get_message(timeout=2)
    assert json.loads(message["data"]) == {"cluster": "rec", "version": 1}
    pubsub.close()


def test_a_held_lock_skips_the_run(routed_cluster, redis_client):
    router(routed_cluster, "r-silent", 8004, heartbeat_age_s=120, applied=1)
    lock = redis_client.lock(f"switchyard:reconcile-lock:{routed_cluster.pk}", timeout=5)
    assert lock.acquire(blocking=False)
    try:
        result = reconcile.reconcile_cluster(
            routed_cluster, redis_client, listening=time.time() - 60
        )
    finally:
        lock.release()
    assert result.actions == [] and result.skipped
