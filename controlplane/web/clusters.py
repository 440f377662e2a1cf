"""Clusters overview and the cluster live view."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from django.core.exceptions import BadRequest
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.utils.dateparse import parse_datetime
from django.views.decorators.http import require_POST

from controlplane.models import Cluster, Instance
from controlplane.selectors import captures as capture_selectors
from controlplane.selectors import clusters as cluster_selectors
from controlplane.services import clusters as cluster_services
from controlplane.services import numbers
from controlplane.services import policies as policy_services
from controlplane.services.errors import NotFound, ServiceError
from router_worker.contract.config import DEFAULT_DECODE_POLICY

from . import dashboard, reads
from .access import actor, operator_required, viewer_required
from .pages import is_htmx, page, service_error_response


def get_cluster(cluster_id: int) -> Cluster:
    try:
        return reads.cluster(cluster_id)
    except NotFound as error:
        raise Http404(error.message) from None


# A moment the history around it (half an hour either side) can still be computed for.
EARLIEST = datetime(1970, 1, 2, tzinfo=UTC)
LATEST = datetime(9999, 12, 30, tzinfo=UTC)


def parse_at(value: str | None) -> datetime | None:
    """`?at=` as ISO 8601 (naive: UTC) or unix seconds; None when absent; BadRequest (400)
    when unreadable or out of range."""
    if not value:
        return None
    try:
        at = parse_datetime(value)
        if at is None:
            at = datetime.fromtimestamp(float(value), tz=UTC)
    except (ValueError, OverflowError, OSError):
        at = None
    if at is not None and at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    if at is None or not EARLIEST <= at <= LATEST:
        raise BadRequest("at: an ISO 8601 time or unix seconds between 1970 and 9999")
    return at


@viewer_required
def cluster_list(request: HttpRequest) -> HttpResponse:
    template = "web/partials/cluster_rows.html" if is_htmx(request) else "web/cluster_list.html"
    return page(request, template, rows=dashboard.overview())


@operator_required
@require_POST
def instance_role(request: HttpRequest, cluster_id: int) -> HttpResponse:
    """The pools' form: move one instance to the prefill pool, the decode pool or both."""
    return _set_instance(request, cluster_id, cluster_services.set_instance_role, "role")


@operator_required
@require_POST
def instance_grey_override(request: HttpRequest, cluster_id: int) -> HttpResponse:
    """The grey-failure form: the operator's word on one instance (force healthy, force
    drained, or automatic: the detector decides)."""
    return _set_instance(request, cluster_id, cluster_services.set_grey_override, "mode")


def _set_instance(
    request: HttpRequest,
    cluster_id: int,
    setter: Callable[..., Instance],
    field: str,
) -> HttpResponse:
    """One instance setter of the service from a live-view form (``instance``, ``field``,
    ``reason``); its refusal re-renders the page with the message, at its status."""
    cluster = get_cluster(cluster_id)
    data = request.POST
    try:
        instance = cluster.instances.get(name=data.get("instance", ""))
    except Instance.DoesNotExist:
        error = ServiceError(f"instance {data.get('instance', '')!r} is not in this cluster")
        return _live_error(request, cluster, error, data, field)
    try:
        setter(actor(request), instance.pk, data.get(field, ""), reason=data.get("reason", ""))
    except ServiceError as error:
        return _live_error(request, cluster, error, data, field)
    return redirect(reverse("web:cluster", args=[cluster.pk]))


@operator_required
@require_POST
def cluster_decider(request: HttpRequest, cluster_id: int) -> HttpResponse:
    """The pools' decider form: when the routers split a request."""
    cluster = get_cluster(cluster_id)
    data = request.POST
    try:
        cluster_services.set_decider(
            actor(request),
            cluster.pk,
            data.get("decider", ""),
            threshold_tokens=data.get("threshold_tokens", ""),
            kv_link=data.get("kv_link", ""),
            reason=data.get("reason", ""),
        )
    except ServiceError as error:
        return _live_error(request, cluster, error, data, "decider")
    return redirect(reverse("web:cluster", args=[cluster.pk]))


@operator_required
@require_POST
def cluster_decode_policy(request: HttpRequest, cluster_id: int) -> HttpResponse:
    """The pools' decode-policy form: which of the cluster's policies places the decode
    stage (blank: the routers' default)."""
    cluster = get_cluster(cluster_id)
    data = request.POST
    try:
        chosen = data.get("policy", "")
        policy_id = numbers.whole_number(chosen, "policy", minimum=1) if chosen else None
        policy_services.set_decode_policy(
            actor(request), cluster.pk, policy_id, reason=data.get("reason", "")
        )
    except ServiceError as error:
        return _live_error(request, cluster, error, data, "decode_policy")
    return redirect(reverse("web:cluster", args=[cluster.pk]))


def _live_error(
    request: HttpRequest, cluster: Cluster, error: ServiceError, form: Any, failed: str
) -> HttpResponse:
    return service_error_response(
        request,
        error,
        "web/cluster_live.html",
        **_live_context(cluster, ""),
        form=form,
        failed=failed,
    )


@viewer_required
def cluster_live(request: HttpRequest, cluster_id: int) -> HttpResponse:
    cluster = get_cluster(cluster_id)
    at = request.GET.get("at", "")
    parse_at(at)  # refused here rather than by the snapshot the page loads
    return page(request, "web/cluster_live.html", **_live_context(cluster, at))


def _live_context(cluster: Cluster, at: str) -> dict[str, Any]:
    snapshot_url = reverse("web:snapshot", args=[cluster.pk])
    live_config = {
        "clusterId": cluster.pk,
        "clusterName": cluster.name,
        "snapshotUrl": f"{snapshot_url}?{urlencode({'at': at})}" if at else snapshot_url,
        "wsPath": f"/ws/clusters/{cluster.pk}/",
        "history": bool(at),
    }
    return {
        "cluster": cluster,
        "tab": "live",
        "at": at,
        "live_config": live_config,
        "capture": capture_selectors.running(cluster.pk),
        "pools": cluster_selectors.pools(cluster),
        "deciders": Cluster.Decider.values,
        "kv_links": Cluster.KvLink.values,
        "default_decode_policy": DEFAULT_DECODE_POLICY,
        "instance_names": list(cluster.instances.order_by("name").values_list("name", flat=True)),
        "grey_overrides": list(
            cluster.instances.order_by("name").values_list("name", "grey_override")
        ),
    }


@viewer_required
def cluster_snapshot(request: HttpRequest, cluster_id: int) -> JsonResponse:
    cluster = get_cluster(cluster_id)
    at = parse_at(request.GET.get("at"))
    return JsonResponse(dashboard.first_paint(cluster, at))
