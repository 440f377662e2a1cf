"""A cluster's traffic captures (their salts never leave the database through here)."""

from __future__ import annotations

from django.db.models import QuerySet

from controlplane.models import TrafficCapture

from .clusters import cluster


def captures(cluster_id: int) -> QuerySet[TrafficCapture]:
    """Newest first."""
    return cluster(cluster_id).captures.order_by("-started_at", "-id").defer("salt")


def running(cluster_id: int) -> TrafficCapture | None:
    return captures(cluster_id).filter(state=TrafficCapture.State.CAPTURING).first()


def replayable(cluster_id: int) -> list[TrafficCapture]:
    """Captures holding requests, which a replay can take as its trace."""
    return list(captures(cluster_id).filter(requests__gt=0))


def capture(cluster_id: int, capture_id: int) -> TrafficCapture | None:
    return captures(cluster_id).filter(pk=capture_id).first()
