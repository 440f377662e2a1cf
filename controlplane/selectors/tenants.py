"""Tenants of a cluster, with how many active client keys each holds."""

from __future__ import annotations

from django.db.models import Count, Q, QuerySet

from controlplane.models import Tenant

from .clusters import cluster
from .common import get_or_404


def tenants(cluster_id: int) -> QuerySet[Tenant]:
    return (
        cluster(cluster_id)
        .tenants.annotate(active_keys=Count("client_keys", filter=Q(client_keys__revoked_at=None)))
        .order_by("name")
    )


def tenant(cluster_id: int, tenant_id: int) -> Tenant:
    return get_or_404(tenants(cluster_id), tenant_id, "tenant")
