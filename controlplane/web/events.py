"""The hotspot audit log and the audit log of every change, both filterable; the telemetry
entries that ingest quarantined."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import redis
from django.core.exceptions import BadRequest
from django.http import HttpRequest, HttpResponse, QueryDict
from django.utils.dateparse import parse_datetime
from django.views.decorators.http import require_GET

from controlplane.models import AuditEvent, HotspotEvent
from controlplane.services import ingest, notify, numbers

from . import reads
from .access import viewer_required
from .pages import page

PAGE_ROWS = 200
QUARANTINE_ROWS = 100
TRANSITIONS = ("suspected", "confirmed", "cleared")
INT_MAX = 2**31 - 1  # Postgres integer ids


def _time(data: QueryDict, name: str) -> datetime | None:
    """A datetime-local or ISO 8601 input (naive values are taken as UTC); BadRequest (400)
    for anything else, such as month 13."""
    value = data.get(name)
    if not value:
        return None
    try:
        parsed = parse_datetime(value)
    except ValueError:
        parsed = None
    if parsed is None:
        raise BadRequest(f"{name}: not a valid date and time")
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed


def _cluster_id(data: QueryDict) -> int | None:
    value = data.get("cluster", "")
    if not value:
        return None
    cluster = numbers.digits(value)
    if cluster is None or cluster > INT_MAX:
        raise BadRequest("cluster: a cluster id")
    return cluster


def _common_filters(data: QueryDict) -> dict[str, Any]:
    return {
        "cluster_id": _cluster_id(data),
        "since": _time(data, "since"),
        "until": _time(data, "until"),
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
