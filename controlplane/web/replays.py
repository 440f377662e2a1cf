"""What-if replay jobs: start one (shared trace or an uploaded file) over chosen policies on
this cluster's model and GPU, watch progress, compare results with what is live now."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from django.core.files.uploadedfile import UploadedFile
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from controlplane.models import Cluster
from controlplane.services import replays as replay_service
from controlplane.services.errors import NotFound, ServiceError
from controlplane.services.traces import TRACE_SUFFIXES, shared_traces, uploads_dir

from . import dashboard, reads
from .access import actor, operator_required, viewer_required
from .clusters import get_cluster
from .pages import is_htmx, page, service_error_response

TEMPLATE = "web/replays.html"
MAX_UPLOAD_BYTES = 64 * 1024 * 1024


def _context(cluster: Cluster) -> dict[str, Any]:
    live = dashboard.live_state(cluster)
    return {"cluster": cluster, "tab": "replays", "traces": shared_traces(),
            "policies": reads.policies(cluster.pk),
            "jobs": reads.replays(cluster.pk)[:20], "live_window": live["window"],
            "live_policy": cluster.active_policy}


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
    try:
        outcome = replay_service.request_replay(actor(request), cluster.pk,
                                                **_replay_args(request, cluster))
    except ServiceError as error:
        return service_error_response(request, error, TEMPLATE, **_context(cluster))
    url = reverse("web:replay_detail", args=[cluster.pk, outcome.job.pk])
    return redirect(url if outcome.dispatched else f"{url}?undispatched=1")


def _replay_args(request: HttpRequest, cluster: Cluster) -> dict[str, Any]:
    data = request.POST
    chosen = {int(pk) for pk in data.getlist("policies") if pk.isdigit()}
    specs = [p.spec() for p in reads.policies(cluster.pk) if p.pk in chosen]
    return {"trace": _trace(request), "policies": specs,
            "rate_scale": _float(data.get("rate_scale") or "1", "rate_scale"),
            "max_requests": int(_float(data["max_requests"], "max_requests"))
            if data.get("max_requests") else None,
            "seed": int(_float(data.get("seed") or "0", "seed")),
            "reason": data.get("reason", "")}


def _trace(request: HttpRequest) -> str:
    upload = request.FILES.get("upload")
    if upload is not None:
        return f"upload:{_store_upload(upload)}"
    name = request.POST.get("trace", "")
    if name not in shared_traces():
        raise ServiceError("choose a shared trace or upload a file", "trace")
    return f"shared:{name}"


def _store_upload(upload: UploadedFile) -> str:
    from enginesim.replay.traces import TraceFormatError, detect_format

    suffix = Path(upload.name or "").suffix.lower()
    if suffix not in TRACE_SUFFIXES or upload.size > MAX_UPLOAD_BYTES:
        raise ServiceError("upload a .jsonl or .csv trace of at most 64 MiB", "upload")
    uploads_dir().mkdir(parents=True, exist_ok=True)
    name = f"{uuid.uuid4().hex}{suffix}"
    path = uploads_dir() / name
    with path.open("wb") as out:
        for chunk in upload.chunks():
            out.write(chunk)
    try:
        detect_format(path)
    except (TraceFormatError, UnicodeDecodeError, ValueError) as error:
        path.unlink(missing_ok=True)
        raise ServiceError(f"not a supported trace (Mooncake, Bailian, Azure): {error}",
                           "upload") from None
    return name


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
    return page(request, template, cluster=cluster, job=job, tab="replays",
                live_window=dashboard.live_state(cluster)["window"],
                undispatched=request.GET.get("undispatched"))
