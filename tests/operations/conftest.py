from __future__ import annotations

import pytest
import redis
from django.conf import settings

from controlplane.models import Cluster, RouterDeployment
from controlplane.services import clusters, policies
from router_worker.contract.telemetry import EVENTS_STREAM, METRICS_STREAM
from tests.operations.helpers import ADMIN


@pytest.fixture
def redis_client():
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(EVENTS_STREAM, METRICS_STREAM)
    for key in client.scan_iter("switchyard:reconcile*"):
        client.delete(key)
    yield client
    client.delete(EVENTS_STREAM, METRICS_STREAM)
    client.close()


@pytest.fixture
def cluster(db) -> Cluster:
    return Cluster.objects.create(name="ops-test", model="Qwen/Qwen2-7B-Instruct", gpu_type="h20")


@pytest.fixture
def cluster_router(cluster) -> RouterDeployment:
    """Router r0 of the cluster: only a cluster's own routers' metrics are ingested."""
    return RouterDeployment.objects.create(cluster=cluster, name="r0", host="ops", port=1)


@pytest.fixture
def routed_cluster(db):
    cluster = clusters.create_cluster(ADMIN, name="rec", model="qwen2-7b", gpu_type="h20")
    clusters.add_instance(ADMIN, cluster.pk, name="i0", url="http://127.0.0.1:9100", reason="x")
    policy = policies.create_policy(ADMIN, cluster.pk, name="lm", kind="lmetric")
    policies.activate_policy(ADMIN, cluster.pk, policy.pk, reason="x")
    return cluster
