from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

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


# Actions that leave the canary as it was: a run of them on one step reads as one row.
REPEATING_ACTIONS = ("wait", "skipped")


@dataclass
class TimelineRow:
    """Consecutive judgements of one step that changed nothing (halts waiting for samples,
    canaries the judge could not judge), shown once with their count and time span; every
    other judgement is a row of its own. ``last`` carries the newest evidence."""

    first: CanaryJudgement
    last: CanaryJudgement
    count: int = 1

    def extends(self, judgement: CanaryJudgement) -> bool:
        return judgement.action in REPEATING_ACTIONS and (
            judgement.step_index,
            judgement.verdict,
            judgement.action,
        ) == (self.last.step_index, self.last.verdict, self.last.action)


def timeline(judgements_oldest_first: Iterable[CanaryJudgement]) -> list[TimelineRow]:
    """The judgements with each run of repeats collapsed, oldest first."""
    rows: list[TimelineRow] = []
    for judgement in judgements_oldest_first:
        if rows and rows[-1].extends(judgement):
            rows[-1].last, rows[-1].count = judgement, rows[-1].count + 1
        else:
            rows.append(TimelineRow(judgement, judgement))
    return rows


def canary_audit(canary: CanarySplit) -> QuerySet[AuditEvent]:
    """The canary's rollout as the audit trail has it (create, start, steps, end)."""
    return AuditEvent.objects.filter(target_type="canarysplit", target_id=str(canary.pk)).order_by(
        "at", "id"
    )
