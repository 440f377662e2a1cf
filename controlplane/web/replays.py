"""What-if replay jobs: start one (shared trace or an uploaded file) over chosen policies on
this cluster's model and GPU, watch progress, compare results with what is live now."""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from controlplane.models import Cluster
from controlplane.services import replays as replay_service
from controlplane.services.errors import NotFound, ServiceError
from controlplane.services.traces import shared_traces

from . import dashboard, reads
from .access import actor, operator_required, viewer_required
from .clusters import get_cluster
from .pages import is_htmx, page, service_error_response

TEMPLATE = "web/replays.html"


def _context(cluster: Cluster) -> dict[str, Any]:
    live = dashboard.live_state(cluster)
    return {
        "cluster": cluster,
        "tab": "replays",
        "traces": shared_traces(),
        "policies": reads.policies(cluster.pk),
        "jobs": reads.replays(cluster.pk)[:20],
        "live_window": live["window"],
        "live_policy": cluster.active_policy,
    }


@viewer_required
@require_GET
def replay_page(request: HttpRequest, cluster_id: int) -> HttpResponse:
    cluster = get_cluster(cluster_id)
    context = _context(cluster)
    if is_htmx(request):
        return page(request, "web/partials/replay_jobs.html", **context)
    return page(request, TEMPLATE, **context)


@operator_required
@require_POST
def replay_create(request: HttpRequest, cluster_id: int) -> HttpResponse:
    cluster = get_cluster(cluster_id)
    upload = request.FILES.get("upload")
    try:
        options = _replay_args(request, cluster)
        if upload is not None:
            outcome = replay_service.request_uploaded_replay(
                actor(request),
                cluster.pk,
                filename=upload.name or "",
                chunks=upload.chunks(),
                **options,
            )
        else:
            outcome = replay_service.request_replay(
                actor(request), cluster.pk, trace=_shared_trace(request), **options
            )
    except ServiceError as error:
        return service_error_response(request, error, TEMPLATE, **_context(cluster))
    url = reverse("web:replay_detail", args=[cluster.pk, outcome.job.pk])
    return redirect(url if outcome.dispatched else f"{url}?undispatched=1")


def _replay_args(request: HttpRequest, cluster: Cluster) -> dict[str, Any]:
    data = request.POST
    chosen = {int(pk) for pk in data.getlist("policies") if pk.isdigit()}
    specs = [p.spec() for p in reads.policies(cluster.pk) if p.pk in chosen]
    return {
        "policies": specs,
        "rate_scale": _float(data.get("rate_scale") or "1", "rate_scale"),
        "max_requests": int(_float(data["max_requests"], "max_requests"))
        if data.get("max_requests")
        else None,
        "seed": int(_float(data.get("seed") or "0", "seed")),
        "reason": data.get("reason", ""),
    }


def _shared_trace(request: HttpRequest) -> str:
    name = request.POST.get("trace", "")
    if name not in shared_traces():
        raise ServiceError("choose a shared trace or upload a file", "trace")
    return f"shared:{name}"


def _float(value: str, field: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ServiceError(f"{field}: {value!r} is not a number", field) from None


@viewer_required
@require_GET
def replay_detail(request: HttpRequest, cluster_id: int, job_id: int) -> HttpResponse:
    cluster = get_cluster(cluster_id)
    try:
        job = reads.replay(job_id)
    except NotFound as error:
        raise Http404(error.message) from None
    if job.cluster_id != cluster.pk:
        raise Http404("replay is not on this cluster")
    template = "web/partials/replay_job.html" if is_htmx(request) else "web/replay_detail.html"
    return page(
        request,
        template,
        cluster=cluster,
        job=job,
        tab="replays",
        live_window=dashboard.live_state(cluster)["window"],
        undispatched=request.GET.get("undispatched"),
    )
