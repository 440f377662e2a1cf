from __future__ import annotations

from django.db.models import QuerySet

from controlplane.models import ReplayJob

from .common import get_or_404


def replays(cluster_id: int | None = None, state: str | None = None) -> QuerySet[ReplayJob]:
    queryset = ReplayJob.objects.select_related("created_by").order_by("-created_at", "-id")
    if cluster_id is not None:
        queryset = queryset.filter(cluster_id=cluster_id)
    return queryset.filter(state=state) if state else queryset


def replay(replay_id: int) -> ReplayJob:
    return get_or_404(replays(), replay_id, "replay")
