"""A canary the judge cannot judge gets an ``error`` row on its timeline once, not one every
run of the judge (every 10 s, for ever); the timeline collapses what repeats."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.models import CanaryJudgement, CanarySplit
from controlplane.services import judge
from tests.canaries import running_canary as make_running_canary


@pytest.mark.django_db
def test_a_persistent_judge_error_is_written_once_per_repeat_period() -> None:
    broken = make_running_canary("judge-err", instances=2, base_port=9300, weight_steps=[10])
    # guardrails as an older release or a hand edit left them: the judgement raises
    CanarySplit.objects.filter(pk=broken.pk).update(
        guardrails={**broken.guardrails, "min_samples": "lots"},
        step_started_at=timezone.now() - timedelta(hours=1),  # the step is due
    )
    for _ in range(30):  # five minutes of judge runs
        assert list(judge.judge_progressing().skipped) == [broken.pk]
    assert broken.judgements.filter(verdict="error").count() == 1
    CanaryJudgement.objects.filter(canary=broken).update(
        at=CanaryJudgement.objects.get(canary=broken).at
        - timedelta(seconds=judge.ERROR_REPEAT_S + 1)
    )
    judge.judge_progressing()
    assert broken.judgements.filter(verdict="error").count() == 2
