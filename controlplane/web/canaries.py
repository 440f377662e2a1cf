"""Canary splits: create, start/pause/resume/promote/abort, live per-arm comparison and the
judge's decisions."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.exceptions import BadRequest
from django.http import Http404, HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from controlplane.models import CanarySplit, Cluster
from controlplane.services import canaries as canary_service
from controlplane.services import guardrails, numbers
from controlplane.services.errors import NotFound, ServiceError
from controlplane.services.validation import policy_kinds
from enginesim.stats import describe
from router_worker.contract.config import DEFAULT_DECODE_POLICY

from . import reads
from .access import actor, operator_required, viewer_required
from .clusters import get_cluster
from .pages import expected_revision, field_errors, page, service_error_response
from .schema_form import param_fields, with_values

TEMPLATE = "web/canary.html"
ACTIONS = ("start", "pause", "resume", "promote", "abort")
COMPARISON_WINDOW = timedelta(minutes=10)


def _context(
    cluster: Cluster,
    form: QueryDict | None = None,
    error: ServiceError | None = None,
    prefill: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The page; after a refused create (``form``, ``error``) the form keeps every value the
    operator entered and shows the message next to its field."""
    canaries = list(
        reads.canaries(cluster.pk)
        .select_related("baseline_policy", "candidate_policy", "candidate_decode_policy")
        .prefetch_related("judgements")[:20]
    )
    current = next((c for c in canaries if c.state in CanarySplit.ACTIVE_STATES), None)
    policies = list(reads.policies(cluster.pk))
    instances = list(reads.instances(cluster.pk))
    default_candidate = next((p.pk for p in policies if p.pk != cluster.active_policy_id), None)
    prefill = prefill or {}
    baseline = _chosen(form, "baseline_policy", prefill.get("baseline", cluster.active_policy_id))
    candidate = _chosen(form, "candidate_policy", prefill.get("candidate", default_candidate))
    source = prefill.get("replay")
    sent = numbers.digits(form.get("source_replay", "") if form is not None else "")
    if sent is not None:
        source = reads.replays(cluster.pk).filter(pk=sent).first()
    return {
        "cluster": cluster,
        "tab": "canary",
        "canaries": canaries,
        "current": current,
        "policies": policies,
        "policy_params": _policy_params(policies),
        "kinds": policy_kinds(),
        "baseline_choice": baseline,
        "candidate_choice": candidate,
        "arms": [("baseline", baseline), ("candidate", candidate)],
        "instances": [(i, _arm(form, i.name, index)) for index, i in enumerate(instances)],
        "guardrails": _guardrails(form, field_errors(error) if error else {}),
        "default_weight_steps": ", ".join(
            f"{s:g}" for s in canary_service.site_defaults().weight_steps
        ),
        "actions": {c.pk: _allowed_actions(c) for c in canaries},
        "source_replay": source,
        "disaggregated": cluster.is_disaggregated(),
        "default_decode_policy": DEFAULT_DECODE_POLICY,
    }


def _policy_params(policies: list) -> dict[int, list]:
    """Each policy's stored parameters with their descriptions, for the arm summaries."""
    kinds = policy_kinds()
    return {
        p.pk: with_values(param_fields(kinds[p.kind]["schema"]), p.params or {}, f"policy{p.pk}")
        for p in policies
        if p.kind in kinds
    }


def _chosen(form: QueryDict | None, key: str, default: int | None) -> str:
    return form.get(key, "") if form is not None else ("" if default is None else str(default))


def _arm(form: QueryDict | None, name: str, index: int) -> str:
    if form is not None:
        return form.get(f"arm.{name}", "")
    return "candidate" if index % 2 else "baseline"


def _guardrails(form: QueryDict | None, errors: dict[str, str]) -> list[dict[str, Any]]:
    return [
        {
            "key": key,
            "default": default,
            "value": form.get(f"guard.{key}", "") if form is not None else default,
            **guardrails.rules(key),
            "error": errors.get(f"guardrails.{key}", ""),
        }
        for key, default in canary_service.site_defaults().guardrails.model_dump().items()
    ]


def _allowed_actions(canary: CanarySplit) -> list[str]:
    return [a for a in ACTIONS if canary.state in canary_service.TRANSITIONS[a][0]]


@viewer_required
@require_GET
def canary_page(request: HttpRequest, cluster_id: int) -> HttpResponse:
    """The page; ``?from_replay=<job>&baseline_policy=<id>&candidate_policy=<id>`` (the
    replay page's recommendation) pre-fills the form."""
    cluster = get_cluster(cluster_id)
    return page(request, TEMPLATE, **_context(cluster, prefill=_prefill(request, cluster)))


def _prefill(request: HttpRequest, cluster: Cluster) -> dict[str, Any]:
    query = request.GET
    replay = query.get("from_replay", "")
    if not replay:
        return {}
    replay_id = numbers.digits(replay)
    if replay_id is None:
        raise BadRequest("from_replay: a replay id")
    job = reads.replays(cluster.pk).filter(pk=replay_id).first()
    if job is None:
        raise Http404(f"replay {replay_id} is not one of {cluster.name}'s")
    chosen = {
        arm: policy
        for arm in ("baseline", "candidate")
        if (policy := numbers.digits(query.get(f"{arm}_policy", ""))) is not None
    }
    return {"replay": job, **chosen}


@operator_required
@require_POST
def canary_create(request: HttpRequest, cluster_id: int) -> HttpResponse:
    cluster = get_cluster(cluster_id)
    try:
        canary_service.create_canary(actor(request), cluster.pk, **_create_args(request.POST))
    except ServiceError as error:
        return service_error_response(
            request,
            error,
            TEMPLATE,
            **_context(cluster, request.POST, error),
            form=request.POST,
            field_errors=field_errors(error),
        )
    return redirect(reverse("web:canary", args=[cluster.pk]))


def _create_args(data: QueryDict) -> dict[str, Any]:
    split = {key[len("arm.") :]: value for key, value in data.items() if key.startswith("arm.")}
    return {
        "name": data.get("name", "").strip(),
        "baseline_policy_id": _int(data.get("baseline_policy"), "baseline_policy_id"),
        "candidate_policy_id": _int(data.get("candidate_policy"), "candidate_policy_id"),
        "candidate_decode_policy_id": (
            _int(data.get("candidate_decode_policy"), "candidate_decode_policy_id")
            if data.get("candidate_decode_policy")
            else None
        ),
        "baseline_instances": sorted(n for n, arm in split.items() if arm == "baseline"),
        "candidate_instances": sorted(n for n, arm in split.items() if arm == "candidate"),
        "weight_steps": [
            _number(s, "weight_steps")
            for s in data.get("weight_steps", "").replace(" ", "").split(",")
            if s
        ],
        "guardrails": guardrails.from_form(
            {key: data.get(f"guard.{key}", "") for key in guardrails.Guardrails.model_fields}
        ),
        "assignment_key": data.get("assignment_key", "session"),
        "source_replay_id": _replay_id(data.get("source_replay", "")),
        "reason": data.get("reason", ""),
    }


def _replay_id(value: str) -> int | None:
    if not value:
        return None
    if not (value.isascii() and value.isdigit() and len(value) < 19):
        raise ServiceError(f"source_replay_id: {value[:40]!r} is not a replay", "source_replay_id")
    return int(value)


def _int(value: str | None, field: str) -> int:
    try:
        return int(value or "")
    except ValueError:
        raise ServiceError(f"{field}: choose a policy", field) from None


def _number(value: str, field: str) -> float:
    return float(numbers.number(value, field))


@operator_required
@require_POST
def canary_action(
    request: HttpRequest, cluster_id: int, canary_id: int, action: str
) -> HttpResponse:
    cluster = get_cluster(cluster_id)
    if action not in ACTIONS:
        return HttpResponse(status=404)
    try:
        canary_service.transition(
            actor(request),
            _own_canary(cluster, canary_id).pk,
            action,
            reason=request.POST.get("reason", ""),
            expected_revision=expected_revision(request.POST),
        )
    except ServiceError as error:  # re-read: the forms show the current revision
        return service_error_response(request, error, TEMPLATE, **_context(get_cluster(cluster.pk)))
    return redirect(reverse("web:canary", args=[cluster.pk]))


def _own_canary(cluster: Cluster, canary_id: int) -> CanarySplit:
    canary = reads.canary(canary_id)
    if canary.cluster_id != cluster.pk:
        raise NotFound(f"canary {canary_id} is not on {cluster.name}", "canary")
    return canary


@viewer_required
@require_GET
def canary_comparison(request: HttpRequest, cluster_id: int, canary_id: int) -> HttpResponse:
    """Per-arm n, mean/p50/p99 TTFT and TPOT with 95% intervals (polled by htmx)."""
    cluster = get_cluster(cluster_id)
    try:
        canary = _own_canary(cluster, canary_id)
    except ServiceError as error:
        raise Http404(error.message) from None
    return page(
        request,
        "web/partials/canary_comparison.html",
        canary=canary,
        arms=arm_comparison(cluster, canary),
        judgements=canary.judgements.order_by("-at")[:50],
    )


def arm_comparison(cluster: Cluster, canary: CanarySplit) -> dict[str, dict[str, Any]]:
    since = canary.step_started_at or (timezone.now() - COMPARISON_WINDOW)
    rollups = reads.arm_rollups(cluster.pk, since=since.replace(second=0, microsecond=0))
    arms: dict[str, dict[str, list[float]]] = {
        "baseline": {"ttft": [], "tpot": []},
        "candidate": {"ttft": [], "tpot": []},
    }
    for rollup in rollups:
        samples = arms.setdefault(rollup.arm, {"ttft": [], "tpot": []})
        samples["ttft"] += rollup.ttft_samples
        samples["tpot"] += rollup.tpot_samples
    return {
        arm: {"ttft": describe(s["ttft"]), "tpot": describe(s["tpot"])} for arm, s in arms.items()
    }
