"""Traffic capture in the UI: start one on a cluster, watch it fill, stop, rename,
download or delete it, and replay it (the replay form, with the capture as its trace)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.utils.text import slugify
from django.views.decorators.http import require_GET, require_POST

from controlplane.models import Cluster
from controlplane.selectors import captures as capture_selectors
from controlplane.services import captures as capture_service
from controlplane.services.errors import ServiceError

from .access import actor, operator_required, viewer_required
from .clusters import get_cluster
from .pages import is_htmx, page, service_error_response

TEMPLATE = "web/captures.html"
ACTIONS = ("stop", "rename", "delete")


def _context(cluster: Cluster, **extra: Any) -> dict[str, Any]:
    return {
        "cluster": cluster,
        "tab": "captures",
        "captures": list(capture_selectors.captures(cluster.pk)),
        "running": capture_selectors.running(cluster.pk),
        "retention_days": f"{settings.SWITCHYARD_CAPTURE_RETENTION_DAYS:g}",
        "default_max_requests": capture_service.DEFAULT_MAX_REQUESTS,
        "max_requests": capture_service.MAX_REQUESTS,
        "default_max_minutes": capture_service.DEFAULT_MAX_MINUTES,
        "max_minutes": capture_service.MAX_MINUTES,
        **extra,
    }


@viewer_required
@require_GET
def captures_page(request: HttpRequest, cluster_id: int) -> HttpResponse:
    cluster = get_cluster(cluster_id)
    if is_htmx(request):
        return page(request, "web/partials/capture_status.html", **_context(cluster))
    return page(request, TEMPLATE, **_context(cluster))


@operator_required
@require_POST
def capture_start(request: HttpRequest, cluster_id: int) -> HttpResponse:
    cluster = get_cluster(cluster_id)
    data = request.POST
    try:
        capture_service.start_capture(
            actor(request),
            cluster.pk,
            name=data.get("name", ""),
            max_requests=data.get("max_requests", ""),
            max_minutes=data.get("max_minutes", ""),
            engine_time_scale=data.get("engine_time_scale", ""),
            reason=data.get("reason", ""),
        )
    except ServiceError as error:
        return service_error_response(request, error, TEMPLATE, **_context(cluster, form=data))
    return redirect(reverse("web:captures", args=[cluster.pk]))


@operator_required
@require_POST
def capture_action(
    request: HttpRequest, cluster_id: int, capture_id: int, action: str
) -> HttpResponse:
    if action not in ACTIONS:
        raise Http404(f"no capture action {action!r}")
    cluster = get_cluster(cluster_id)
    data, who = request.POST, actor(request)
    reason = data.get("reason", "")
    try:
        if action == "stop":
            capture_service.stop_capture(who, cluster.pk, capture_id, reason=reason)
        elif action == "rename":
            capture_service.rename_capture(
                who, cluster.pk, capture_id, name=data.get("name", ""), reason=reason
            )
        else:
            capture_service.delete_capture(who, cluster.pk, capture_id, reason=reason)
    except ServiceError as error:
        return service_error_response(request, error, TEMPLATE, **_context(cluster))
    return redirect(reverse("web:captures", args=[cluster.pk]))


@viewer_required
@require_GET
def capture_download(
    request: HttpRequest, cluster_id: int, capture_id: int
) -> StreamingHttpResponse:
    cluster = get_cluster(cluster_id)
    capture = capture_selectors.capture(cluster.pk, capture_id)
    if capture is None:
        raise Http404(f"capture {capture_id} of {cluster.name} does not exist")
    response = StreamingHttpResponse(
        capture_service.download(actor(request), capture), content_type="application/x-ndjson"
    )
    name = slugify(f"{cluster.name}-{capture.name}") or "capture"
    response["Content-Disposition"] = f'attachment; filename="{name}-{capture.pk}.jsonl"'
    return response
