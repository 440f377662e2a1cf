"""Reconcile a cluster's desired routing state with what its routers report.

Idempotent and locked: a per-cluster Redis lock keeps two beat runs from acting at once,
and each action (restart a silent router, re-announce a config version a router has not
applied) is claimed with a Redis key that lives for one heartbeat timeout, so running
reconcile twice in a row takes one action, not two.

Heartbeat silence means something only while the control plane could listen. Each run
first asks the control plane's own `/healthz` (the URL routers heartbeat to: web tier,
Postgres and Redis all up) and keeps, in Redis, since when it has been listening without a
break; a router is restarted only when its silence covers a whole heartbeat timeout of that
window. A web-tier outage or partition, a Postgres outage, or reconcile itself not running
(beat or workers down) resets the window, so routers get a full timeout to report after
any outage. The restart itself is a request to the router's host: its supervisor restarts
the process only if it does not answer (see RouterSupervisor.restart_if_unresponsive).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import httpx
import redis
from django.conf import settings

from controlplane.models import Cluster, RouterDeployment

from . import notify
from .config import latest_version

LOCK_TIMEOUT_S = 30
LISTENING_KEY = "switchyard:reconcile:listening"
PROBE_TIMEOUT_S = 3.0


@dataclass
class ReconcileResult:
    cluster: str
    actions: list[str] = field(default_factory=list)
    skipped: str = ""


def _claim(client: redis.Redis, key: str) -> bool:
    ttl = max(1, int(settings.ROUTER_HEARTBEAT_TIMEOUT_S))
    return bool(client.set(key, "1", nx=True, ex=ttl))


def control_plane_answers() -> bool:
    """The control plane can record heartbeats: its /healthz (web tier, Postgres, Redis) is
    200 at the URL routers are given."""
    url = settings.SWITCHYARD_CONTROL_PLANE_URL.rstrip("/") + "/healthz"
    try:
        return httpx.get(url, timeout=PROBE_TIMEOUT_S, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def listening_since(client: redis.Redis) -> float | None:
    """Unix time since which the control plane has been able to receive heartbeats without a
    break (as seen by successive reconcile runs); None while it cannot."""
    if not control_plane_answers():
        client.delete(LISTENING_KEY)
        return None
    now = time.time()
    state = client.hgetall(LISTENING_KEY)
    since = now
    if state and now - float(state[b"checked"]) <= settings.ROUTER_LISTEN_GAP_S:
        since = float(state[b"since"])
    client.hset(LISTENING_KEY, mapping={"since": since, "checked": now})
    return since


def reconcile_all(client: redis.Redis) -> list[ReconcileResult]:
    since = listening_since(client)
    return [reconcile_cluster(c, client, listening=since) for c in Cluster.objects.all()]


def reconcile_cluster(
    cluster: Cluster, client: redis.Redis | None = None, *, listening: float | None = None
) -> ReconcileResult:
    """`listening`: what listening_since() returned for this run (None: restart nobody)."""
    client = client or notify.redis_client()
    result = ReconcileResult(cluster.name)
    lock = client.lock(
        f"switchyard:reconcile-lock:{cluster.pk}", timeout=LOCK_TIMEOUT_S, blocking=False
    )
    if not lock.acquire():
        result.skipped = "another reconcile holds the lock"
        return result
    try:
        latest = latest_version(cluster)
        for router in cluster.routers.filter(desired_state=RouterDeployment.Desired.RUNNING):
            action = _action_for(router, latest.number if latest else None, listening)
            if action and _claim(client, f"switchyard:reconcile:{action}:{router.pk}"):
                _perform(action, router, latest.number if latest else None)
                result.actions.append(f"{action} {router.name}")
    finally:
        lock.release()
    return result


def _silent(router: RouterDeployment, listening: float | None) -> bool:
    """No heartbeat for a whole timeout during which the control plane was listening."""
    if router.last_heartbeat is None or listening is None:
        return False
    silent_from = max(router.last_heartbeat.timestamp(), listening)
    return time.time() - silent_from > settings.ROUTER_HEARTBEAT_TIMEOUT_S


def _action_for(
    router: RouterDeployment, latest: int | None, listening: float | None
) -> str | None:
    if _silent(router, listening):
        return "restart"
    if (
        latest is not None
        and router.last_heartbeat is not None
        and router.applied_version != latest
    ):
        return "push"
    return None


def _perform(action: str, router: RouterDeployment, latest: int | None) -> None:
    if action == "restart":
        from controlplane.celery import app
        from controlplane.router_hosts.bootstep import host_queue

        # A request queued while the host's worker is away is stale by the time it returns.
        app.send_task(
            "switchyard.restart_router",
            args=[router.pk],
            queue=host_queue(router.host),
            expires=settings.ROUTER_HEARTBEAT_TIMEOUT_S,
        )
    elif action == "push" and latest is not None:
        notify.config_version_created(router.cluster.name, latest)
