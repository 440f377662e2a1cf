from __future__ import annotations

from django.db.models import QuerySet

from controlplane.models import CanarySplit

from .clusters import cluster
from .common import get_or_404


def canaries(cluster_id: int, state: str | None = None) -> QuerySet[CanarySplit]:
    queryset = cluster(cluster_id).canaries.order_by("-created_at", "-id")
    return queryset.filter(state=state) if state else queryset


def canary(canary_id: int) -> CanarySplit:
    queryset = CanarySplit.objects.prefetch_related("judgements")
    return get_or_404(queryset, canary_id, "canary")
