"""Hotspot transitions and the audit trail: filtered, newest first, paginated; telemetry
entries that ingest quarantined."""

import redis
from django.http import HttpRequest
from ninja import Query, Router
from ninja.errors import HttpError
from ninja.pagination import paginate

from controlplane.selectors import events as event_selectors
from controlplane.services import ingest, notify

from .pagination import Pages
from .schemas import (
    AuditEventOut,
    AuditFilters,
    HotspotEventOut,
    HotspotFilters,
    QuarantineFilters,
    QuarantineOut,
)

routes = Router(tags=["events"])


@routes.get("/hotspot-events", response=list[HotspotEventOut])
@paginate(Pages)
def list_hotspot_events(request: HttpRequest, filters: Query[HotspotFilters]):
    return event_selectors.hotspot_events(
        cluster_id=filters.cluster,
        since=filters.since,
        until=filters.until,
        prefix_class=filters.prefix_class,
        transition=filters.transition,
    )


@routes.get("/audit-events", response=list[AuditEventOut])
@paginate(Pages)
def list_audit_events(request: HttpRequest, filters: Query[AuditFilters]):
    return event_selectors.audit_events(
        cluster_id=filters.cluster,
        action=filters.action,
        actor=filters.actor,
        since=filters.since,
        until=filters.until,
    )


@routes.get("/telemetry-quarantine", response=QuarantineOut)
def telemetry_quarantine(request: HttpRequest, filters: Query[QuarantineFilters]):
    """Router events and metrics records ingest could not store, with the reason."""
    try:
        with notify.redis_client() as client:
            summary = ingest.quarantine_summary(client, limit=filters.limit)
    except redis.RedisError as error:
        raise HttpError(503, "Redis is unreachable; the quarantine cannot be read") from error
    return {
        "total": summary.total,
        "counts": summary.counts,
        "entries": [vars(entry) for entry in summary.entries],
    }
