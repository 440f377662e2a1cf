from __future__ import annotations

from typing import Any

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


def cells(job: ReplayJob) -> list[dict[str, Any]]:
    """The job's cells for its page: each with its policy's kind."""
    policies = job.inputs.get("policies") or []
    rows = []
    for cell in job.cells.order_by("index"):
        spec = policies[cell.policy] if cell.policy < len(policies) else {}
        rows.append({"cell": cell, "kind": spec.get("kind", f"policy {cell.policy}")})
    return rows
