from __future__ import annotations

from django.db.models import Max, OuterRef, QuerySet, Subquery

from controlplane.models import ConfigVersion, RouterDeployment

from .common import get_or_404


def _with_current_version(queryset: QuerySet[RouterDeployment]) -> QuerySet[RouterDeployment]:
    newest = (
        ConfigVersion.objects.filter(cluster=OuterRef("cluster"))
        .values("cluster")
        .annotate(n=Max("number"))
        .values("n")
    )
    return queryset.annotate(current_version=Subquery(newest))


def routers(cluster_id: int | None = None) -> QuerySet[RouterDeployment]:
    queryset = _with_current_version(RouterDeployment.objects.order_by("cluster_id", "name"))
    return queryset.filter(cluster_id=cluster_id) if cluster_id is not None else queryset


def router(router_id: int) -> RouterDeployment:
    return get_or_404(routers(), router_id, "router")
