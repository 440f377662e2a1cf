"""Policy control: pick an existing policy or define a new one (form generated from the
policy's parameter schema), give a reason, confirm; then watch routers apply the version."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.db import transaction
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from controlplane.models import Cluster, Policy
from controlplane.selectors import robustness
from controlplane.services import clusters as cluster_services
from controlplane.services import config as config_service
from controlplane.services import policies as policy_service
from controlplane.services.errors import ServiceError
from controlplane.services.validation import policy_kinds
from router_worker.routing.sessions import SESSION_SOURCES

from . import dashboard, reads
from .access import actor, operator_required, viewer_required
from .clusters import get_cluster
from .pages import expected_revision, field_errors, page, service_error_response
from .schema_form import bind, param_fields, params_from_form, with_values

TEMPLATE = "web/policy.html"


def _kind_fields(kind: str) -> list:
    kinds = policy_kinds()
    return param_fields(kinds[kind]["schema"]) if kind in kinds else []


def _context(
    cluster: Cluster, kind: str | None = None, refused: tuple[QueryDict, ServiceError] | None = None
) -> dict[str, Any]:
    """The page; after a refused submit (``refused``: the posted form and the error) the
    new-policy inputs keep what the operator typed, each with its own message."""
    kinds = policy_kinds()
    kind = (
        kind
        if kind in kinds
        else (cluster.active_policy.kind if cluster.active_policy else next(iter(kinds)))
    )
    fields = _kind_fields(kind)
    errors: dict[str, str] = {}
    if refused is not None:
        errors = field_errors(refused[1])
        if refused[0].get("policy") == "new":
            fields = bind(fields, refused[0], errors)
    latest = config_service.latest_version(cluster)
    policies = list(reads.policies(cluster.pk))
    return {
        "cluster": cluster,
        "tab": "policy",
        "policies": policies,
        "policy_params": {
            p.pk: with_values(
                param_fields(kinds[p.kind]["schema"]), p.params or {}, f"policy{p.pk}"
            )
            for p in policies
            if p.kind in kinds
        },
        "kinds": kinds,
        "kind": kind,
        "fields": fields,
        "robustness": robustness.by_kind(kinds),
        "field_errors": errors,
        "canary": config_service.active_canary(cluster),
        "target_version": latest.number if latest else None,
        "session_sources": [(s, s in cluster.session_sources) for s in SESSION_SOURCES],
    }


@viewer_required
@require_GET
def policy_page(request: HttpRequest, cluster_id: int) -> HttpResponse:
    cluster = get_cluster(cluster_id)
    return page(
        request,
        TEMPLATE,
        **_context(cluster, request.GET.get("kind")),
        applied=request.GET.get("applied"),
        applied_version=request.GET.get("version"),
        sources_set=request.GET.get("sources_set"),
    )


@viewer_required
@require_GET
def policy_params(request: HttpRequest, cluster_id: int) -> HttpResponse:
    """The parameter inputs of one policy kind (swapped in by htmx when the kind changes)."""
    get_cluster(cluster_id)
    kind = request.GET.get("kind", "")
    kinds = policy_kinds()
    return page(
        request,
        "web/partials/policy_params.html",
        fields=_kind_fields(kind),
        kind=kind,
        kinds=kinds,
        robustness=robustness.by_kind(kinds),
    )


@operator_required
@require_POST
def policy_apply(request: HttpRequest, cluster_id: int) -> HttpResponse:
    cluster = get_cluster(cluster_id)
    try:
        _require_confirmation(request)
        policy = _apply(request, cluster)
    except ServiceError as error:  # re-read: the form shows the current revision
        return service_error_response(
            request,
            error,
            TEMPLATE,
            **_context(get_cluster(cluster.pk), request.POST.get("kind"), (request.POST, error)),
            form=request.POST,
        )
    version = config_service.latest_version(cluster)
    query = urlencode({"applied": policy.name, "version": version.number if version else ""})
    return redirect(f"{reverse('web:policy', args=[cluster.pk])}?{query}")


def _require_confirmation(request: HttpRequest) -> None:
    if request.POST.get("confirm") != "yes":
        raise ServiceError("confirm that routing on this cluster will change", "confirm")


@transaction.atomic
def _apply(request: HttpRequest, cluster: Cluster) -> Policy:
    """Activate the chosen policy, creating it first when it is new (one transaction)."""
    who = actor(request)
    reason = request.POST.get("reason", "")
    choice = request.POST.get("policy", "new")
    if choice == "new":
        kind = request.POST.get("kind", "")
        policy = policy_service.create_policy(
            who,
            cluster.pk,
            name=request.POST.get("name", "").strip(),
            kind=kind,
            params=params_from_form(kind, _kind_fields(kind), request.POST),
            description=request.POST.get("description", ""),
            reason=reason,
        )
    else:
        try:
            policy = reads.policies(cluster.pk).get(pk=int(choice))
        except (ValueError, Policy.DoesNotExist):
            raise ServiceError("choose a policy of this cluster", "policy") from None
    return policy_service.activate_policy(
        who, cluster.pk, policy.pk, reason=reason, expected_revision=expected_revision(request.POST)
    )


@operator_required
@require_POST
def session_sources_set(request: HttpRequest, cluster_id: int) -> HttpResponse:
    """The session-sources form: one checkbox per source and a reason, through the same
    service (and audit) as ``PUT /api/v1/clusters/{id}/session-sources``."""
    cluster = get_cluster(cluster_id)
    try:
        cluster_services.set_session_sources(
            actor(request),
            cluster.pk,
            request.POST.getlist("sources"),
            reason=request.POST.get("reason", ""),
            expected_revision=expected_revision(request.POST),
        )
    except ServiceError as error:  # re-read: the form shows the stored sources and revision
        return service_error_response(
            request, error, TEMPLATE, **_context(get_cluster(cluster.pk)), sources_form=request.POST
        )
    return redirect(f"{reverse('web:policy', args=[cluster.pk])}?sources_set=1")


@viewer_required
@require_GET
def router_versions(request: HttpRequest, cluster_id: int) -> HttpResponse:
    """Each router's reported config version against the newest one (polled by htmx)."""
    cluster = get_cluster(cluster_id)
    latest = config_service.latest_version(cluster)
    live = dashboard.live_state(cluster)
    return page(
        request,
        "web/partials/router_versions.html",
        routers=dashboard.router_rows(cluster, live),
        target_version=latest.number if latest else None,
    )
