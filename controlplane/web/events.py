"""The hotspot audit log and the audit log of every change, both filterable; the telemetry
entries that ingest quarantined."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import redis
from django.http import HttpRequest, HttpResponse, QueryDict
from django.utils.dateparse import parse_datetime
from django.views.decorators.http import require_GET

from controlplane.models import AuditEvent, HotspotEvent
from controlplane.services import ingest, notify

from . import reads
from .access import viewer_required
from .pages import page

PAGE_ROWS = 200
QUARANTINE_ROWS = 100
TRANSITIONS = ("suspected", "confirmed", "cleared")


def _time(value: str | None) -> datetime | None:
    """A datetime-local or ISO 8601 input; naive values are taken as UTC."""
    if not value:
        return None
    parsed = parse_datetime(value)
    if parsed is not None and parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed


def _cluster_id(data: QueryDict) -> int | None:
    value = data.get("cluster", "")
    return int(value) if value.isdigit() else None


def _common_filters(data: QueryDict) -> dict[str, Any]:
    return {
        "cluster_id": _cluster_id(data),
        "since": _time(data.get("since")),
        "until": _time(data.get("until")),
    }


@viewer_required
@require_GET
def hotspot_log(request: HttpRequest) -> HttpResponse:
    events = reads.hotspot_events(
        **_common_filters(request.GET),
        prefix_class=request.GET.get("prefix_class") or None,
        transition=request.GET.get("transition") or None,
    ).select_related("cluster")
    return page(
        request,
        "web/hotspots.html",
        events=events[:PAGE_ROWS],
        clusters=reads.clusters(),
        transitions=TRANSITIONS,
        filters=request.GET,
        classes=_distinct(HotspotEvent, "prefix_class"),
        tab="hotspots",
        quarantine=_quarantine(0),
    )


@viewer_required
@require_GET
def audit_log(request: HttpRequest) -> HttpResponse:
    events = reads.audit_events(
        **_common_filters(request.GET),
        action=request.GET.get("action") or None,
        actor=request.GET.get("actor") or None,
    ).select_related("cluster")
    return page(
        request,
        "web/audit.html",
        events=events[:PAGE_ROWS],
        clusters=reads.clusters(),
        filters=request.GET,
        actions=_distinct(AuditEvent, "action"),
        actors=_distinct(AuditEvent, "actor_name"),
        tab="audit",
    )


def _distinct(model, field: str) -> list[str]:
    return list(model.objects.order_by(field).values_list(field, flat=True).distinct()[:200])


@viewer_required
@require_GET
def telemetry_quarantine(request: HttpRequest) -> HttpResponse:
    summary = _quarantine(QUARANTINE_ROWS)
    error = None if summary is not None else "Redis is unreachable: quarantine unknown."
    return page(
        request,
        "web/quarantine.html",
        summary=summary,
        error=error,
        rows=QUARANTINE_ROWS,
        tab="hotspots",
    )


def _quarantine(rows: int) -> ingest.QuarantineSummary | None:
    """Telemetry entries ingest could not store (count and the newest ``rows``); None when
    Redis does not answer (the page still renders)."""
    try:
        with notify.redis_client() as client:
            return ingest.quarantine_summary(client, limit=rows)
    except redis.RedisError:
        return None
