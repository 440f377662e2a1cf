"""Hotspot transitions and the audit trail: filtered, newest first, paginated."""


from django.http import HttpRequest
from ninja import Query, Router
from ninja.pagination import paginate

from controlplane.selectors import events as event_selectors

from .pagination import Pages
from .schemas import AuditEventOut, AuditFilters, HotspotEventOut, HotspotFilters

router = Router(tags=["events"])


@router.get("/hotspot-events", response=list[HotspotEventOut])
@paginate(Pages)
def list_hotspot_events(request: HttpRequest, filters: Query[HotspotFilters]):
    return event_selectors.hotspot_events(
        cluster_id=filters.cluster, since=filters.since, until=filters.until,
        prefix_class=filters.prefix_class, transition=filters.transition)


@router.get("/audit-events", response=list[AuditEventOut])
@paginate(Pages)
def list_audit_events(request: HttpRequest, filters: Query[AuditFilters]):
    return event_selectors.audit_events(
        cluster_id=filters.cluster, action=filters.action, actor=filters.actor,
        since=filters.since, until=filters.until)
