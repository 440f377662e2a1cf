"""Reconcile a cluster's desired routing state with what its routers report.

Idempotent and locked: a per-cluster Redis lock keeps two beat runs from acting at once,
and each action (restart a silent router, re-announce a config version a router has not
applied) is claimed with a Redis key that lives for one heartbeat timeout, so running
reconcile twice in a row takes one action, not two.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import redis
from django.conf import settings
from django.utils import timezone

from controlplane.models import Cluster, RouterDeployment

from . import notify
from .config import latest_version

LOCK_TIMEOUT_S = 30


@dataclass
class ReconcileResult:
    cluster: str
    actions: list[str] = field(default_factory=list)
    skipped: str = ""


def _claim(client: redis.Redis, key: str) -> bool:
    ttl = max(1, int(settings.ROUTER_HEARTBEAT_TIMEOUT_S))
    return bool(client.set(key, "1", nx=True, ex=ttl))


def reconcile_cluster(cluster: Cluster, client: redis.Redis | None = None) -> ReconcileResult:
    client = client or notify.redis_client()
    result = ReconcileResult(cluster.name)
    lock = client.lock(f"switchyard:reconcile-lock:{cluster.pk}", timeout=LOCK_TIMEOUT_S,
                       blocking=False)
    if not lock.acquire():
        result.skipped = "another reconcile holds the lock"
        return result
    try:
        latest = latest_version(cluster)
        for router in cluster.routers.filter(desired_state=RouterDeployment.Desired.RUNNING):
            action = _action_for(router, latest.number if latest else None)
            if action and _claim(client, f"switchyard:reconcile:{action}:{router.pk}"):
                _perform(action, router, latest.number if latest else None)
                result.actions.append(f"{action} {router.name}")
    finally:
        lock.release()
    return result


def _action_for(router: RouterDeployment, latest: int | None) -> str | None:
    timeout = timedelta(seconds=settings.ROUTER_HEARTBEAT_TIMEOUT_S)
    if router.last_heartbeat is not None and timezone.now() - router.last_heartbeat > timeout:
        return "restart"
    if latest is not None and router.last_heartbeat is not None \
            and router.applied_version != latest:
        return "push"
    return None


def _perform(action: str, router: RouterDeployment, latest: int | None) -> None:
    if action == "restart":
        from controlplane.celery import app
        from controlplane.routers.bootstep import host_queue

        app.send_task("switchyard.restart_router", args=[router.pk],
                      queue=host_queue(router.host))
    elif action == "push" and latest is not None:
        notify.config_version_created(router.cluster.name, latest)
