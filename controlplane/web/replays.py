"""What-if replay jobs: start one (shared trace or an uploaded file) over chosen policies on
this cluster's model and GPU, watch progress, compare results with what is live now."""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from controlplane.models import Cluster
from controlplane.selectors import captures as capture_selectors
from controlplane.selectors import replays as replay_selectors
from controlplane.selectors import robustness
from controlplane.selectors import tenants as tenant_selectors
from controlplane.services import numbers
from controlplane.services import replays as replay_service
from controlplane.services.errors import NotFound, Problems, ServiceError
from controlplane.services.traces import shared_traces

from . import dashboard, reads
from .access import actor, operator_required, viewer_required
from .clusters import get_cluster
from .pages import field_errors, is_htmx, page, service_error_response

FLOW_MODES = (
    ("cluster", "as the cluster's routers"),
    ("on", "on"),
    ("off", "off"),
)
TEMPLATE = "web/replays.html"


def _context(cluster: Cluster, chosen_trace: str = "") -> dict[str, Any]:
    live = dashboard.live_state(cluster)
    return {
        "cluster": cluster,
        "tab": "replays",
        "traces": shared_traces(),
        "captures": capture_selectors.replayable(cluster.pk),
        "chosen_trace": chosen_trace,
        "policies": reads.policies(cluster.pk),
        "robustness": robustness.by_kind(),
        "jobs": reads.replays(cluster.pk)[:20],
        "live_window": live["window"],
        "live_policy": cluster.active_policy,
        "tenants": list(tenant_selectors.tenants(cluster.pk)),
        "flow_modes": FLOW_MODES,
    }


def engine_time(window: dict[str, Any] | None, cluster: Cluster) -> dict[str, Any] | None:
    """The live window's latencies and rates in the engines' own time, as a replay's are
    (a simulated cluster's engines run ``engine_time_scale`` times slower than the wall)."""
    scale = cluster.engine_time_scale or 1.0
    if not window or scale == 1.0:
        return window
    scaled = dict(window)
    for key, value in window.items():
        if not isinstance(value, int | float) or isinstance(value, bool):
            continue
        if key.endswith("_per_s"):
            scaled[key] = value * scale
        elif key.endswith("_s"):
            scaled[key] = value / scale
    return scaled


@viewer_required
@require_GET
def replay_page(request: HttpRequest, cluster_id: int) -> HttpResponse:
    cluster = get_cluster(cluster_id)
    context = _context(cluster, request.GET.get("trace", ""))
    if is_htmx(request):
        return page(request, "web/partials/replay_jobs.html", **context)
    return page(request, TEMPLATE, **context)


@operator_required
@require_POST
def replay_create(request: HttpRequest, cluster_id: int) -> HttpResponse:
    cluster = get_cluster(cluster_id)
    upload = request.FILES.get("upload")
    try:
        options = _replay_args(request, cluster, shared_trace=upload is None)
        if upload is not None:
            outcome = replay_service.request_uploaded_replay(
                actor(request),
                cluster.pk,
                filename=upload.name or "",
                chunks=upload.chunks(),
                **options,
            )
        else:
            outcome = replay_service.request_replay(actor(request), cluster.pk, **options)
    except ServiceError as error:
        return service_error_response(
            request,
            error,
            TEMPLATE,
            errors=field_errors(error),
            form=request.POST,
            **_context(cluster),
        )
    url = reverse("web:replay_detail", args=[cluster.pk, outcome.job.pk])
    return redirect(url if outcome.dispatched else f"{url}?undispatched=1")


def _replay_args(request: HttpRequest, cluster: Cluster, *, shared_trace: bool) -> dict[str, Any]:
    """The form's options (with the chosen shared trace unless a file was uploaded); every
    unreadable value is refused together."""
    data = request.POST
    chosen = {pk for pk in map(numbers.digits, data.getlist("policies")) if pk is not None}
    problems = Problems()
    max_requests = data.get("max_requests", "").strip()
    picked = [p for p in reads.policies(cluster.pk) if p.pk in chosen]
    options = {
        "policies": [p.spec() for p in picked],
        "policy_ids": [p.pk for p in picked],
        "rate_scales": problems.check(_numbers, _rate_scales_text(data), "rate_scales"),
        "max_requests": problems.check(_max_requests, max_requests) if max_requests else None,
        "seed": problems.check(_whole, data.get("seed") or "0", "seed"),
        "seeds": problems.check(_whole, data.get("seeds") or "1", "seeds"),
        "flow": data.get("flow") or "cluster",  # the service names a bad one
        "tenant_scales": problems.check(_tenant_scales_text, data.get("tenant_scales", "")),
        "reason": data.get("reason", ""),
    }
    if shared_trace:
        options["trace"] = problems.check(_shared_trace, data.get("trace", ""))
    problems.raise_any()
    return options


def _shared_trace(name: str) -> str:
    """A shared trace's name, or ``capture:<id>`` (checked by the service)."""
    if name.startswith("capture:"):
        return name
    if name not in shared_traces():
        raise ServiceError("choose a shared trace, a capture or upload a file", "trace")
    return f"shared:{name}"


def _tenant_scales_text(text: str) -> dict[str, float]:
    """``tenant_scales`` ("team-a=2, default=0.5") as tenant -> factor (the service checks
    the tenants and the factors' range)."""
    scales: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.replace(";", ",").split(","))):
        tenant, equals, factor = (x.strip() for x in part.partition("="))
        if not tenant or not equals or len(scales) >= 16:
            raise ServiceError(
                "tenant_scales: write TENANT=FACTOR pairs separated by commas, e.g. team-a=2",
                "tenant_scales",
            )
        if tenant in scales:
            raise ServiceError(f"tenant_scales: {tenant[:64]!r} is named twice", "tenant_scales")
        scales[tenant] = float(numbers.number(factor, "tenant_scales"))
    return scales


def _rate_scales_text(data: Any) -> str:
    """``rate_scales`` ("1, 1.5"); a single ``rate_scale`` as forms sent it before."""
    return data.get("rate_scales") or data.get("rate_scale") or "1"


def _numbers(text: str, field: str) -> list[float]:
    parts = [part.strip() for part in text.replace(";", ",").split(",")]
    if not all(parts) or len(parts) > 16:
        raise ServiceError(
            f"{field}: write rates as numbers separated by commas, e.g. 1, 1.5", field
        )
    return [float(numbers.number(part, field)) for part in parts]


def _whole(value: str, field: str) -> int:
    return numbers.whole_number(value, field)


def _max_requests(value: str) -> int:
    """Capped as the API caps it (a larger one would reach the database and fail there)."""
    return numbers.whole_number(
        value, "max_requests", minimum=1, maximum=replay_service.MAX_REQUESTS
    )


def _named(recommendation: dict[str, Any] | None, cluster: Cluster) -> dict[str, Any] | None:
    """The recommendation with its policies' rows (names, for the page)."""
    if recommendation is None:
        return None
    policies = {p.pk: p for p in reads.policies(cluster.pk)}
    return {
        **recommendation,
        "active_policy": policies.get(recommendation["active"]),
        "candidate_policy": policies.get(recommendation["candidate"] or -1),
    }


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
        cells=replay_selectors.cells(job),
        recommendation=_named(replay_selectors.recommendation(job), cluster),
        canaries=list(job.canaries.order_by("-created_at")),
        tab="replays",
        live_window=engine_time(dashboard.live_state(cluster)["window"], cluster),
        undispatched=request.GET.get("undispatched"),
    )
