"""Reads behind the dashboard pages: the clusters overview and the live view's first paint.
They combine selectors (Postgres) with the routers' live state (Redis)."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

import redis
from django.utils import timezone

from controlplane.models import ArmMetricRollup, Cluster, HotspotEvent
from controlplane.realtime.snapshot import empty_cluster
from controlplane.realtime.state import read_cluster, read_decisions
from controlplane.services import config as config_service
from controlplane.services.notify import redis_client
from engine_interface import percentile

from . import reads

log = logging.getLogger(__name__)
HISTORY = timedelta(minutes=30)


def live_state(cluster: Cluster) -> dict[str, Any]:
    """The merged live snapshot; an empty one (flagged) when Redis does not answer."""
    try:
        with redis_client() as client:
            return read_cluster(client, cluster.name, cluster.pk)
    except redis.RedisError as error:
        log.warning("live state of %s unavailable: %s", cluster.name, error)
        return {**empty_cluster(cluster.name, cluster.pk), "unavailable": str(error)}


def recent_decisions(cluster: Cluster) -> list[dict[str, Any]]:
    """The cluster's latest sampled routing decisions, newest first; none without Redis."""
    try:
        with redis_client() as client:
            return read_decisions(client, cluster.name)
    except redis.RedisError as error:
        log.warning("decisions of %s unavailable: %s", cluster.name, error)
        return []


def last_minute_latency(cluster: Cluster) -> dict[str, float | None]:
    """TTFT/TPOT p50/p99 over the most recent complete minute of rollups (all arms)."""
    since = timezone.now() - timedelta(minutes=2)
    rows = list(
        ArmMetricRollup.objects.filter(cluster=cluster, minute__gte=since).order_by("-minute")
    )
    if rows:
        newest = rows[0].minute
        rows = [r for r in rows if r.minute == newest]
    ttft = sorted(s for r in rows for s in r.ttft_samples)
    tpot = sorted(s for r in rows for s in r.tpot_samples)
    return {
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p99_s": percentile(ttft, 99),
        "tpot_p50_s": percentile(tpot, 50),
        "tpot_p99_s": percentile(tpot, 99),
    }


def router_rows(cluster: Cluster, live: dict[str, Any]) -> list[dict[str, Any]]:
    """Every router of the cluster: deployed (Postgres) and/or reporting (Redis)."""
    reporting = {r["router"]: r for r in live["routers"]}
    rows = []
    for deployment in reads.routers(cluster.pk):
        report = reporting.pop(deployment.name, None)
        rows.append(
            {
                "name": deployment.name,
                "desired": deployment.desired_state,
                "applied_version": deployment.applied_version,
                "live_version": report["config_version"] if report else None,
                "policy": report["policy"] if report else None,
                "reporting": report is not None,
            }
        )
    rows += [
        {
            "name": name,
            "desired": None,
            "applied_version": None,
            "reporting": True,
            "live_version": r["config_version"],
            "policy": r["policy"],
        }
        for name, r in sorted(reporting.items())
    ]
    return rows


def instance_counts(cluster: Cluster, live: dict[str, Any]) -> dict[str, int]:
    if live["instances"]:
        health = [i["health"] for i in live["instances"]]
        return {
            "up": health.count("healthy"),
            "draining": health.count("draining"),
            "down": health.count("down"),
        }
    states = [(i.state, i.healthy) for i in cluster.instances.all()]
    return {
        "up": sum(1 for s, h in states if s == "enabled" and h is not False),
        "draining": sum(1 for s, _ in states if s == "draining"),
        "down": sum(1 for s, h in states if s == "down" or h is False),
    }


def cluster_row(cluster: Cluster) -> dict[str, Any]:
    live = live_state(cluster)
    latency = last_minute_latency(cluster)
    source = "rollup"
    if latency["ttft_p50_s"] is None:
        latency = {k: live["window"].get(k) for k in latency}
        source = "live window"
    latest = config_service.latest_version(cluster)
    return {
        "cluster": cluster,
        "live": live,
        "instances": instance_counts(cluster, live),
        "canary": config_service.active_canary(cluster),
        "routers": router_rows(cluster, live),
        "latency": latency,
        "latency_source": source,
        "version": latest.number if latest else None,
    }


def overview() -> list[dict[str, Any]]:
    return [cluster_row(c) for c in reads.clusters().prefetch_related("instances")]


def chart_annotations(cluster: Cluster, since: datetime, until: datetime) -> list[dict[str, Any]]:
    """Config changes and hotspot transitions in [since, until], oldest first."""
    versions = [
        {
            "kind": "config",
            "at": v.created_at.timestamp(),
            "label": f"config v{v.number}",
            "detail": v.reason,
        }
        for v in cluster.versions.filter(created_at__gte=since, created_at__lte=until)
    ]
    hotspots = [
        {
            "kind": "hotspot",
            "at": h.at.timestamp(),
            "label": f"hotspot {h.transition} {h.prefix_class}",
            "detail": f"x/x̄={h.x:g}/{h.x_bar:g} |M|/|M̄|={h.m}/{h.m_bar}",
        }
        for h in HotspotEvent.objects.filter(cluster=cluster, at__gte=since, at__lte=until)
    ]
    return sorted(versions + hotspots, key=lambda a: a["at"])


def arm_history(cluster: Cluster, since: datetime, until: datetime) -> list[dict[str, Any]]:
    """Per-minute rollups per arm in [since, until] for the charts' history."""
    rows = reads.arm_rollups(cluster.pk, since=since, until=until).order_by("minute")
    return [
        {
            "at": r.minute.timestamp(),
            "arm": r.arm,
            "requests": r.requests,
            "ttft_p50_s": r.ttft_p50_s,
            "ttft_p99_s": r.ttft_p99_s,
            "tpot_p50_s": r.tpot_p50_s,
            "tpot_p99_s": r.tpot_p99_s,
        }
        for r in rows
    ]


def first_paint(cluster: Cluster, at: datetime | None = None) -> dict[str, Any]:
    """What the live view loads over HTTP before applying websocket messages."""
    until = at + HISTORY / 2 if at else timezone.now()
    since = until - HISTORY
    return {
        "cluster": {
            "id": cluster.pk,
            "name": cluster.name,
            "model": cluster.model,
            "gpu_type": cluster.gpu_type,
        },
        "at": at.timestamp() if at else None,
        "live": None if at else live_state(cluster),
        "decisions": [] if at else recent_decisions(cluster),
        "annotations": chart_annotations(cluster, since, until),
        "history": arm_history(cluster, since, until),
        "server_time": timezone.now().timestamp(),
    }
