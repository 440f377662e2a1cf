"""Hotspot transitions and the audit trail, filtered."""

from __future__ import annotations

from datetime import datetime

from django.db.models import QuerySet

from controlplane.models import AuditEvent, HotspotEvent

from .common import in_time_range


def hotspot_events(
    *,
    cluster_id: int | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    prefix_class: str | None = None,
    transition: str | None = None,
) -> QuerySet[HotspotEvent]:
    queryset = in_time_range(HotspotEvent.objects.order_by("-at", "-id"), "at", since, until)
    if cluster_id is not None:
        queryset = queryset.filter(cluster_id=cluster_id)
    if prefix_class:
        queryset = queryset.filter(prefix_class=prefix_class)
    if transition:
        queryset = queryset.filter(transition=transition)
    return queryset


def audit_events(
    *,
    cluster_id: int | None = None,
    action: str | None = None,
    actor: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> QuerySet[AuditEvent]:
    queryset = in_time_range(AuditEvent.objects.order_by("-at", "-id"), "at", since, until)
    if cluster_id is not None:
        queryset = queryset.filter(cluster_id=cluster_id)
    if action:
        queryset = queryset.filter(action=action)
    if actor:
        queryset = queryset.filter(actor_name=actor)
    return queryset
