"""Tenants of a cluster: create, change, remove, and which tenant a client key belongs to.

Every change is validated field by field with the routers' own class
(``router_worker.routing.flow.TenantSettings``), audited, and published as a new config
version (the routers follow with their next config fetch). Removing a tenant moves its
keys to the cluster's default tenant; a router keeps the requests of a removed tenant
that are waiting in its queues and releases them under the default tenant's settings.
"""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from pydantic import ValidationError

from controlplane.models import ClientKey, Cluster, Tenant
from router_worker.routing.flow import TenantSettings

from . import audit, config
from .audit import Actor
from .clusters import locked_cluster
from .config import TENANT_FIELDS as FIELDS
from .config import settings_of
from .errors import Conflict, Invalid, NotFound, ServiceError


def checked(values: dict[str, Any]) -> TenantSettings:
    """``values`` validated as the routers will, or Invalid naming every field at fault."""
    unknown = sorted(set(values) - {"name", *FIELDS})
    if unknown:
        raise Invalid([{"field": name, "message": f"{name}: unknown field"} for name in unknown])
    try:
        return TenantSettings.model_validate(values)
    except ValidationError as error:
        raise Invalid(
            [
                {
                    "field": ".".join(str(part) for part in item["loc"]) or None,
                    "message": f"{'.'.join(str(p) for p in item['loc'])}: {item['msg']}",
                }
                for item in error.errors()
            ]
        ) from None


@transaction.atomic
def create_tenant(
    actor: Actor, cluster_id: int, values: dict[str, Any], *, reason: str = ""
) -> Tenant:
    cluster = locked_cluster(cluster_id)
    settings = checked(values)
    try:
        with transaction.atomic():
            tenant = Tenant.objects.create(
                cluster=cluster, created_by=actor.name, **settings.model_dump()
            )
    except IntegrityError:
        raise Conflict(
            f"{cluster.name} already has a tenant named {settings.name!r}", "name"
        ) from None
    _publish(actor, cluster, "tenant.create", tenant, None, reason or f"tenant {tenant.name!r}")
    return tenant


@transaction.atomic
def update_tenant(
    actor: Actor, cluster_id: int, tenant_id: int, changes: dict[str, Any], *, reason: str = ""
) -> Tenant:
    """Change some of a tenant's settings (its name stays: keys and captures refer to it)."""
    cluster = locked_cluster(cluster_id)
    tenant = _locked(cluster, tenant_id)
    if "name" in changes and changes["name"] != tenant.name:
        raise ServiceError("a tenant's name cannot change; create another tenant", "name")
    before = settings_of(tenant)
    settings = checked({**before, **changes})
    for name in FIELDS:
        setattr(tenant, name, getattr(settings, name))
    tenant.save(update_fields=list(FIELDS))
    _publish(actor, cluster, "tenant.update", tenant, before, reason or f"tenant {tenant.name!r}")
    return tenant


@transaction.atomic
def delete_tenant(actor: Actor, cluster_id: int, tenant_id: int, *, reason: str = "") -> None:
    """Remove a tenant; its keys fall back to the default tenant."""
    cluster = locked_cluster(cluster_id)
    tenant = _locked(cluster, tenant_id)
    before = {
        **settings_of(tenant),
        "keys": list(tenant.client_keys.values_list("name", flat=True)),
    }
    tenant.client_keys.update(tenant=None)
    target = Tenant(pk=tenant.pk, name=tenant.name, cluster=cluster)
    tenant.delete()
    version = config.publish(cluster, actor, reason or f"tenant {target.name!r} removed")
    audit.record(
        actor,
        "tenant.delete",
        target,
        before=before,
        after={"config_version": version.number if version else None},
        reason=reason or f"tenant {target.name!r} removed; its keys go to the default tenant",
        cluster=cluster,
    )


@transaction.atomic
def set_key_tenant(
    actor: Actor, cluster_id: int, key_id: int, tenant_id: int | None, *, reason: str = ""
) -> ClientKey:
    """Move a client key to a tenant (None: the default tenant)."""
    cluster = locked_cluster(cluster_id)
    try:
        key = ClientKey.objects.select_for_update().get(pk=key_id, cluster=cluster)
    except ClientKey.DoesNotExist:
        raise NotFound(f"client key {key_id} does not exist on {cluster.name}") from None
    tenant = None if tenant_id is None else _locked(cluster, tenant_id, field="tenant_id")
    before = {"tenant": key.tenant.name if key.tenant else None}
    key.tenant = tenant
    key.save(update_fields=["tenant"])
    version = config.publish(cluster, actor, reason or f"client key {key.name!r} moved")
    audit.record(
        actor,
        "client_key.tenant",
        key,
        before=before,
        after={
            "tenant": tenant.name if tenant else None,
            "config_version": version.number if version else None,
        },
        reason=reason or f"client key {key.name!r} to {tenant.name if tenant else 'default'}",
        cluster=cluster,
    )
    return key


def _locked(cluster: Cluster, tenant_id: int, field: str | None = None) -> Tenant:
    try:
        return Tenant.objects.select_for_update().get(pk=tenant_id, cluster=cluster)
    except Tenant.DoesNotExist:
        raise NotFound(f"tenant {tenant_id} does not exist on {cluster.name}", field) from None


def _publish(
    actor: Actor,
    cluster: Cluster,
    action: str,
    tenant: Tenant,
    before: dict[str, Any] | None,
    reason: str,
) -> None:
    version = config.publish(cluster, actor, reason)
    audit.record(
        actor,
        action,
        tenant,
        before=before,
        after={
            **settings_of(tenant),
            "config_version": version.number if version else None,
        },
        reason=reason,
        cluster=cluster,
    )
