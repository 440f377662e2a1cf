"""Drill: canaries the judge cannot judge, beside ones it can, judged by a real Celery worker.

One canary's stored guardrails are hostile (a min_samples that is no number, as a hand edit
or an older release could leave them; it raises inside the judgement) and another's step
is 1e14 s long (it overflowed the judge's date arithmetic). Before, either stopped the
judge's whole pass, so the canaries after it were never judged. Now each healthy, due
canary gets its verdict and its audit row, and the broken one an ``error`` judgement on
its own timeline saying why.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from celery.contrib.testing.worker import start_worker
from django.utils import timezone

from controlplane.celery import app
from controlplane.models import ArmMetricRollup, AuditEvent, CanarySplit
from controlplane.tasks import judge_canaries
from tests.canaries import running_canary

from .report import Outcome, record

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]
HEALTHY = 3


def due_canary(name: str) -> CanarySplit:
    """A started canary whose first step has run two minutes with equal arms (it passes)."""
    canary = running_canary(name, instances=2, base_port=9400, weight_steps=[25, 50])
    cluster = canary.cluster
    minute = (timezone.now() - timedelta(minutes=2)).replace(second=0, microsecond=0)
    for arm in ("baseline", "candidate"):  # equal arms: the step passes
        ArmMetricRollup.objects.create(
            cluster=cluster,
            arm=arm,
            minute=minute,
            requests=100,
            ttft_samples=[0.2 + 0.001 * (k % 7) for k in range(100)],
            tpot_samples=[0.02] * 100,
        )
    CanarySplit.objects.filter(pk=canary.pk).update(
        step_started_at=timezone.now() - timedelta(minutes=2)
    )
    return canary


def test_a_canary_the_judge_cannot_judge_skips_no_other(settings) -> None:
    import celery.contrib.testing.tasks  # noqa: F401  registers celery.ping for the ready check

    hostile = due_canary("drill-a-hostile")
    healthy = [due_canary(f"drill-healthy-{k}") for k in range(HEALTHY)]
    endless = due_canary("drill-endless")
    CanarySplit.objects.filter(pk=hostile.pk).update(
        guardrails={**hostile.guardrails, "min_samples": "lots"}
    )
    CanarySplit.objects.filter(pk=endless.pk).update(
        guardrails={**endless.guardrails, "step_seconds": 1e14}
    )
    with start_worker(app, pool="solo", concurrency=1, perform_ping_check=True):
        run = judge_canaries.delay().get(timeout=60)

    verdicts = {int(k): v for k, v in run["verdicts"].items()}
    skipped = {int(k) for k in run["skipped"]}
    outcome = Outcome()
    for canary in (hostile, *healthy, endless):
        if canary.pk in verdicts:  # judged, or (the 1e14 s step) rightly not due
            outcome.add("ok")
        elif canary.pk in skipped and canary.judgements.filter(verdict="error").exists():
            outcome.add(
                "clear", "error judgement: " + canary.judgements.get().evidence["reasons"][0]
            )
        else:
            outcome.add("lost", f"{canary.name}: neither judged nor reported")
    outcome.judgements_skipped = sum(verdicts.get(c.pk) != "pass" for c in healthy)
    advanced = AuditEvent.objects.filter(action="canary.advance").count()
    outcome.audit_events_lost = HEALTHY - advanced
    record(
        "a canary the judge cannot judge (hostile guardrails, a 1e14 s step)",
        outcome,
        None,
        notes=f"{HEALTHY} healthy due canaries beside them, judged by a real Celery worker: "
        f"verdicts {sorted(v or 'not due' for v in verdicts.values())}; the hostile one "
        "recorded as an error judgement on its timeline, the 1e14 s step read as not due; "
        "audit events lost = healthy advances without their audit row",
    )
    assert outcome.lost == 0, outcome.lost_examples
    assert outcome.judgements_skipped == 0 and outcome.audit_events_lost == 0
    assert skipped == {hostile.pk} and verdicts[endless.pk] is None
