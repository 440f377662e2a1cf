from __future__ import annotations

from django.db.models import QuerySet

from controlplane.models import AuditEvent, CanaryJudgement, CanarySplit

from .clusters import cluster
from .common import get_or_404


def canaries(cluster_id: int, state: str | None = None) -> QuerySet[CanarySplit]:
    queryset = cluster(cluster_id).canaries.order_by("-created_at", "-id")
    return queryset.filter(state=state) if state else queryset


def canary(canary_id: int) -> CanarySplit:
    queryset = CanarySplit.objects.prefetch_related("judgements")
    return get_or_404(queryset, canary_id, "canary")


def canary_with_policies(canary_id: int) -> CanarySplit:
    """One canary and its two policies, without its judgements (read on their own)."""
    queryset = CanarySplit.objects.select_related("baseline_policy", "candidate_policy")
    return get_or_404(queryset, canary_id, "canary")


def judgements(canary_id: int) -> QuerySet[CanaryJudgement]:
    """Every decision of the judge on one canary, oldest first (its timeline)."""
    return get_or_404(CanarySplit.objects.all(), canary_id, "canary").judgements.order_by(
        "at", "id"
    )


def canary_audit(canary: CanarySplit) -> QuerySet[AuditEvent]:
    """The canary's lifecycle as the audit trail has it (create, start, steps, end)."""
    return AuditEvent.objects.filter(target_type="canarysplit", target_id=str(canary.pk)).order_by(
        "at", "id"
    )
