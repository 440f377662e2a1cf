"""Tenants in the UI: who shares a cluster's fleet, their class, share and limits, and
which tenant each client key belongs to. Operators create, change and remove them; every
value is checked by the routers' own class and refused field by field."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from controlplane.models import Cluster
from controlplane.selectors import access as access_selectors
from controlplane.selectors import tenants as tenant_selectors
from controlplane.services import clusters as cluster_service
from controlplane.services import tenants as tenant_service
from controlplane.services.config import TENANT_FIELDS
from controlplane.services.errors import ServiceError
from router_worker.routing.flow import BUDGET_PERIODS, PRIORITIES

from .access import actor, operator_required, viewer_required
from .clusters import get_cluster
from .pages import field_errors, page

TEMPLATE = "web/tenants.html"
LIMITS = ("requests_per_minute", "tokens_per_minute", "token_budget")


def _context(cluster: Cluster, edit: dict[str, Any] | None = None) -> dict[str, Any]:
    """The page's context; ``edit``: a refused change (the tenant's id, the values as
    typed, the errors per field), shown on that tenant's row."""
    keys = [k for k in access_selectors.client_keys(cluster.pk) if k.revoked_at is None]
    tenants = list(tenant_selectors.tenants(cluster.pk))
    return {
        "cluster": cluster,
        "tab": "tenants",
        "tenants": tenants,
        "rows": [_row(tenant, edit) for tenant in tenants],
        "keys": keys,
        "priorities": PRIORITIES,
        "periods": tuple(BUDGET_PERIODS),
    }


def _row(tenant: Any, edit: dict[str, Any] | None) -> dict[str, Any]:
    """A tenant's edit form: its settings, or what was typed with the refusals."""
    if edit is not None and edit["id"] == tenant.pk:
        form = edit["form"]
        values = {name: form.get(name, "") for name in TENANT_FIELDS}
        return {"t": tenant, "values": values, "errors": edit["errors"]}
    values = {name: getattr(tenant, name) for name in TENANT_FIELDS}
    return {"t": tenant, "values": values, "errors": {}}


def _values(data: QueryDict, *, change: bool) -> dict[str, Any]:
    """The form's settings as typed (the service checks them): a blank box is the default
    on a create; on a change, a blank limit clears it and any other blank box keeps it."""
    values: dict[str, Any] = {}
    for name in TENANT_FIELDS:
        text = data.get(name, "").strip()
        if text:
            values[name] = text
        elif change and name in LIMITS:
            values[name] = None
    return values


def _refused(
    request: HttpRequest,
    cluster: Cluster,
    error: ServiceError,
    form: Any,
    edit_id: int | None = None,
) -> HttpResponse:
    """The page again with the refusal: on the create form (``form``), or on the row of
    the tenant whose change was refused (``edit_id``), field by field."""
    errors = field_errors(error)
    edit = None
    if edit_id is not None:
        edit, errors = {"id": edit_id, "form": request.POST, "errors": errors}, {}
    return page(
        request,
        TEMPLATE,
        status=error.status,
        error=error.message,
        errors=errors,
        form=form,
        **_context(cluster, edit),
    )


@viewer_required
@require_GET
def tenants_page(request: HttpRequest, cluster_id: int) -> HttpResponse:
    return page(request, TEMPLATE, **_context(get_cluster(cluster_id)))


@operator_required
@require_POST
def tenant_create(request: HttpRequest, cluster_id: int) -> HttpResponse:
    cluster = get_cluster(cluster_id)
    values = {"name": request.POST.get("name", "").strip(), **_values(request.POST, change=False)}
    try:
        tenant_service.create_tenant(
            actor(request), cluster.pk, values, reason=request.POST.get("reason", "")
        )
    except ServiceError as error:
        return _refused(request, cluster, error, request.POST)
    return redirect(reverse("web:tenants", args=[cluster.pk]))


@operator_required
@require_POST
def tenant_update(request: HttpRequest, cluster_id: int, tenant_id: int) -> HttpResponse:
    cluster = get_cluster(cluster_id)
    try:
        tenant_service.update_tenant(
            actor(request),
            cluster.pk,
            tenant_id,
            _values(request.POST, change=True),
            reason=request.POST.get("reason", ""),
        )
    except ServiceError as error:
        return _refused(request, cluster, error, None, edit_id=tenant_id)
    return redirect(reverse("web:tenants", args=[cluster.pk]))


@operator_required
@require_POST
def tenant_delete(request: HttpRequest, cluster_id: int, tenant_id: int) -> HttpResponse:
    cluster = get_cluster(cluster_id)
    try:
        tenant_service.delete_tenant(
            actor(request), cluster.pk, tenant_id, reason=request.POST.get("reason", "")
        )
    except ServiceError as error:
        return _refused(request, cluster, error, None)
    return redirect(reverse("web:tenants", args=[cluster.pk]))


@operator_required
@require_POST
def key_tenant(request: HttpRequest, cluster_id: int, key_id: int) -> HttpResponse:
    cluster = get_cluster(cluster_id)
    chosen = request.POST.get("tenant_id", "").strip()
    try:
        if chosen and not chosen.isdigit():
            raise ServiceError("choose a tenant of the list", "tenant_id")
        tenant_service.set_key_tenant(
            actor(request),
            cluster.pk,
            key_id,
            int(chosen) if chosen else None,
            reason=request.POST.get("reason", ""),
        )
    except ServiceError as error:
        return _refused(request, cluster, error, None)
    return redirect(reverse("web:tenants", args=[cluster.pk]))


@operator_required
@require_POST
def flow_tpot_slo(request: HttpRequest, cluster_id: int) -> HttpResponse:
    """The page's flow-control form: the TPOT SLO in ms (blank: off)."""
    cluster = get_cluster(cluster_id)
    text = request.POST.get("tpot_slo_ms", "").strip()
    try:
        cluster_service.set_flow_tpot_slo(
            actor(request), cluster.pk, text or None, reason=request.POST.get("reason", "")
        )
    except ServiceError as error:
        return _refused(request, cluster, error, request.POST)
    return redirect(reverse("web:tenants", args=[cluster.pk]))
