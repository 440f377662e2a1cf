"""Reconcile compares desired state with heartbeats; running it twice acts once."""

from __future__ import annotations

import json
import time

import pytest

from controlplane.services import reconcile
from router_worker.contract.telemetry import CONFIG_CHANNEL
from tests.operations.helpers import router

pytestmark = pytest.mark.django_db(transaction=True)


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
