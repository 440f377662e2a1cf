"""Clusters overview and the cluster live view."""

from __future__ import annotations

from datetime import UTC, datetime
from urllib.parse import urlencode

from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.urls import reverse
from django.utils.dateparse import parse_datetime

from controlplane.models import Cluster
from controlplane.services.errors import NotFound

from . import dashboard, reads
from .access import viewer_required
from .pages import is_htmx, page


def get_cluster(cluster_id: int) -> Cluster:
    try:
        return reads.cluster(cluster_id)
    except NotFound as error:
        raise Http404(error.message) from None


def parse_at(value: str | None) -> datetime | None:
    """`?at=` as ISO 8601 or unix seconds; None when absent or unreadable."""
    if not value:
        return None
    try:
        return datetime.fromtimestamp(float(value), tz=UTC)
    except ValueError:
        return parse_datetime(value)


@viewer_required
def cluster_list(request: HttpRequest) -> HttpResponse:
    template = "web/partials/cluster_rows.html" if is_htmx(request) else "web/cluster_list.html"
    return page(request, template, rows=dashboard.overview())


@viewer_required
def cluster_live(request: HttpRequest, cluster_id: int) -> HttpResponse:
    cluster = get_cluster(cluster_id)
    at = request.GET.get("at", "")
    snapshot_url = reverse("web:snapshot", args=[cluster.pk])
    live_config = {
        "clusterId": cluster.pk,
        "clusterName": cluster.name,
        "snapshotUrl": f"{snapshot_url}?{urlencode({'at': at})}" if at else snapshot_url,
        "wsPath": f"/ws/clusters/{cluster.pk}/",
        "history": bool(at),
    }
    return page(
        request,
        "web/cluster_live.html",
        cluster=cluster,
        tab="live",
        at=at,
        live_config=live_config,
    )


@viewer_required
def cluster_snapshot(request: HttpRequest, cluster_id: int) -> JsonResponse:
    cluster = get_cluster(cluster_id)
    at = parse_at(request.GET.get("at"))
    return JsonResponse(dashboard.first_paint(cluster, at))
