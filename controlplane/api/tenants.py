"""Tenants: who shares a cluster's fleet, with which priority class, share and limits.
Operators create, change and remove them; a client key is moved to a tenant here. Values
are checked by the routers' own class, field by field (400 naming each field at fault)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.http import HttpRequest
from ninja import Field, Router, Schema, Status
from pydantic import ConfigDict

from controlplane.models import Tenant
from controlplane.selectors import tenants as tenant_selectors
from controlplane.services import tenants as tenant_services

from .access import ClientKeyOut, key_out
from .auth import actor_of, role
from .schemas import Id, Name, Reason

routes = Router(tags=["tenants"])

BIG = 10**15


class TenantFields(Schema):
    """Every setting optional: a create fills in the defaults, a change keeps the rest. An
    unknown field is refused, not ignored (a tenant's name cannot change)."""

    model_config = ConfigDict(extra="forbid")

    priority: str | None = Field(
        None, max_length=16, description="critical, standard (default) or sheddable."
    )
    weight: float | None = Field(None, description="Share within its class (default 1).")
    requests_per_minute: int | None = Field(None, ge=-BIG, le=BIG)
    tokens_per_minute: int | None = Field(None, ge=-BIG, le=BIG)
    token_budget: int | None = Field(None, ge=-BIG, le=BIG)
    budget_period: str | None = Field(None, max_length=16, description="hour, day or week.")
    max_queued: int | None = Field(None, ge=-BIG, le=BIG)
    max_queued_bytes: int | None = Field(None, ge=-BIG, le=BIG)
    reason: Reason = ""


class TenantIn(TenantFields):
    name: Name


class TenantOut(Schema):
    id: int
    cluster_id: int
    name: str
    priority: str
    weight: float
    requests_per_minute: int | None
    tokens_per_minute: int | None
    token_budget: int | None
    budget_period: str
    max_queued: int
    max_queued_bytes: int
    active_keys: int
    created_at: datetime
    created_by: str


class KeyTenantIn(Schema):
    tenant_id: Id | None = Field(description="The tenant; null: the default tenant.")
    reason: Reason = ""


def tenant_out(tenant: Tenant) -> dict[str, Any]:
    keys = getattr(tenant, "active_keys", None)
    if keys is None:
        keys = tenant.client_keys.filter(revoked_at=None).count()
    return {
        **{
            field: getattr(tenant, field)
            for field in TenantOut.model_fields
            if field != "active_keys"
        },
        "active_keys": keys,
    }


def _values(payload: TenantFields, clearable: bool) -> dict[str, Any]:
    """The settings the client sent (a change may clear a limit with an explicit null)."""
    sent = payload.dict(exclude_unset=True)
    sent.pop("reason", None)
    if clearable:
        return sent
    return {name: value for name, value in sent.items() if value is not None}


@routes.get("/clusters/{cluster_id}/tenants", response=list[TenantOut])
def list_tenants(request: HttpRequest, cluster_id: Id):
    return [tenant_out(t) for t in tenant_selectors.tenants(cluster_id)]


@routes.post("/clusters/{cluster_id}/tenants", response={201: TenantOut}, auth=role("operator"))
def create_tenant(request: HttpRequest, cluster_id: Id, payload: TenantIn):
    tenant = tenant_services.create_tenant(
        actor_of(request), cluster_id, _values(payload, False), reason=payload.reason
    )
    return Status(201, tenant_out(tenant))


@routes.patch(
    "/clusters/{cluster_id}/tenants/{tenant_id}", response=TenantOut, auth=role("operator")
)
def update_tenant(request: HttpRequest, cluster_id: Id, tenant_id: Id, payload: TenantFields):
    """Change the settings sent; `null` clears a limit."""
    tenant = tenant_services.update_tenant(
        actor_of(request), cluster_id, tenant_id, _values(payload, True), reason=payload.reason
    )
    return tenant_out(tenant)


@routes.delete(
    "/clusters/{cluster_id}/tenants/{tenant_id}", response={204: None}, auth=role("operator")
)
def delete_tenant(request: HttpRequest, cluster_id: Id, tenant_id: Id, reason: Reason = ""):
    """Remove the tenant: its keys go to the default tenant; routers release its waiting
    requests under the default tenant's settings."""
    tenant_services.delete_tenant(actor_of(request), cluster_id, tenant_id, reason=reason)
    return Status(204, None)


@routes.put(
    "/clusters/{cluster_id}/client-keys/{key_id}/tenant",
    response=ClientKeyOut,
    auth=role("operator"),
)
def set_key_tenant(request: HttpRequest, cluster_id: Id, key_id: Id, payload: KeyTenantIn):
    key = tenant_services.set_key_tenant(
        actor_of(request), cluster_id, key_id, payload.tenant_id, reason=payload.reason
    )
    return key_out(key)
