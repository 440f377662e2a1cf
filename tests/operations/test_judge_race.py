"""Two (here four) canary judges at once: one acts on the step, the others find it already
acted on; no step is skipped and no failure counted twice."""

from __future__ import annotations

import threading

import pytest
from django.db import connections

from controlplane.models import AuditEvent, CanaryJudgement, CanarySplit
from controlplane.services.judge import judge_canary
from tests.canaries import running_canary
from tests.operations.helpers import arm, feed

pytestmark = pytest.mark.django_db(transaction=True)
JUDGES = 4


@pytest.fixture
def four_step_canary() -> CanarySplit:
    return running_canary(
        "race", base_port=9200, weight_steps=[10, 25, 50, 100], guardrails={"max_failures": 5}
    )


def judge_at_once(canary_id: int) -> list:
    barrier = threading.Barrier(JUDGES)
    results: list = []

    def run() -> None:
        try:
            barrier.wait()
            results.append(judge_canary(canary_id))
        except Exception as error:  # reported by the assertions
            results.append(error)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run) for _ in range(JUDGES)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return results


def test_concurrent_judges_advance_one_step(four_step_canary):
    feed(four_step_canary, arm(0.5), arm(0.5))
    results = judge_at_once(four_step_canary.pk)
    four_step_canary.refresh_from_db()
    assert [r for r in results if isinstance(r, Exception)] == []
    assert four_step_canary.step_index == 1
    assert CanaryJudgement.objects.filter(canary=four_step_canary).count() == 1
    assert AuditEvent.objects.filter(action="canary.advance").count() == 1


def test_concurrent_judges_count_a_failure_once(four_step_canary):
    feed(four_step_canary, arm(0.5), arm(1.0))
    results = judge_at_once(four_step_canary.pk)
    four_step_canary.refresh_from_db()
    assert [r for r in results if isinstance(r, Exception)] == []
    assert four_step_canary.failures == 1
    assert AuditEvent.objects.filter(action="canary.step_failed").count() == 1
