"""The canary judge on synthetic samples, and its actions on a real canary."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from controlplane.models import (
    AuditEvent,
    CanaryJudgement,
    CanarySplit,
    ConfigVersion,
)
from controlplane.services.guardrails import Guardrails, validate_guardrails
from controlplane.services.judge import ArmSample, judge, judge_canary
from tests.canaries import running_canary as make_running_canary
from tests.operations.helpers import arm, feed

# latencies that can never fail the tests: only the guards decide
GUARDS = Guardrails(effect_tolerance=10.0)


def judged(canary_id: int) -> CanaryJudgement:
    """The judgement of a canary that has one to make."""
    judgement = judge_canary(canary_id)
    assert judgement is not None
    return judgement


def test_clear_regression_fails_with_evidence():
    verdict = judge({"baseline": arm(0.5), "candidate": arm(0.9)}, Guardrails())
    assert verdict.verdict == "fail"
    ttft = next(t for t in verdict.tests if t.metric == "ttft")
    assert ttft.p_value is not None and ttft.effect is not None
    assert ttft.outcome == "fail" and ttft.p_value < 1e-6 and ttft.effect > 0.5
    assert ttft.n_baseline == ttft.n_candidate == 200


def test_no_difference_passes():
    verdict = judge({"baseline": arm(0.5), "candidate": arm(0.5)}, Guardrails())
    assert verdict.verdict == "pass", verdict.reasons


def test_too_little_data_halts_never_passes():
    verdict = judge({"baseline": arm(0.5, n=10), "candidate": arm(0.5, n=10)}, Guardrails())
    assert verdict.verdict == "halt"


def test_error_rate_guard_fails_even_when_latency_is_fine():
    verdict = judge({"baseline": arm(0.5), "candidate": arm(0.5, errors=20)}, Guardrails())
    assert verdict.verdict == "fail"
    assert any("error rate" in reason for reason in verdict.reasons)


def test_hotspot_fallback_rate_guard_holds_at_its_limit_and_fails_beyond_it():
    """The default limit is half the candidate's decisions (0.5): 100 of 200 holds, 101
    fails whatever the latencies say."""
    assert Guardrails().max_hotspot_fallback_rate == 0.5
    at_limit = judge({"baseline": arm(0.5), "candidate": arm(0.5, fallbacks=100)}, GUARDS)
    assert at_limit.verdict == "pass", at_limit.reasons
    beyond = judge({"baseline": arm(0.5), "candidate": arm(0.5, fallbacks=101)}, GUARDS)
    assert beyond.verdict == "fail"
    assert beyond.reasons == ["hotspot fallback rate 0.505 > 0.5"]
    guard = next(g for g in beyond.guards if g.name == "hotspot_fallback_rate")
    assert (guard.value, guard.limit, guard.passed) == (0.505, 0.5, False)


def tail(median: float, slow: float, n: int = 200) -> ArmSample:
    """An arm whose median is ``median`` s and whose slowest 10% take ``slow`` s."""
    fast = [median] * (n - n // 10)
    return ArmSample(requests=n, ttft_s=fast + [slow] * (n // 10), tpot_s=[0.02] * n)


def test_a_tail_the_median_test_cannot_see_fails_the_ttft_p95_guard():
    """Both arms answer 90% of requests in 0.5 s; the candidate's slowest tenth takes 8 s
    against the baseline's 2 s: the medians agree, the p95 ratio is 8 / 2 = 4 > 3."""
    assert Guardrails().max_ttft_p95_ratio == 3.0
    verdict = judge({"baseline": tail(0.5, 2.0), "candidate": tail(0.5, 8.0)}, Guardrails())
    ttft = next(t for t in verdict.tests if t.metric == "ttft")
    assert ttft.outcome == "pass"  # the median test alone would promote it
    assert verdict.verdict == "fail"
    assert verdict.reasons == ["TTFT p95 ratio 4.000 > 3"]
    guard = next(g for g in verdict.guards if g.name == "ttft_p95_ratio")
    assert (guard.value, guard.limit, guard.passed) == (4.0, 3.0, False)


def test_the_ttft_p95_guard_holds_at_its_limit_and_waits_for_min_samples():
    at_limit = judge({"baseline": tail(0.5, 2.0), "candidate": tail(0.5, 6.0)}, Guardrails())
    assert at_limit.verdict == "pass", at_limit.reasons
    few = judge({"baseline": tail(0.5, 2.0, n=20), "candidate": tail(0.5, 8.0, n=20)}, GUARDS)
    guard = next(g for g in few.guards if g.name == "ttft_p95_ratio")
    assert (guard.value, guard.passed, few.verdict) == (None, None, "halt")


@pytest.mark.django_db
def test_a_candidate_with_a_slow_tail_is_rolled_back(running_canary):
    """The tail reaches the judge from the rollups and rolls the canary back."""
    feed(running_canary, tail(0.5, 2.0), tail(0.5, 10.0))
    judgement = judged(running_canary.pk)
    running_canary.refresh_from_db()
    assert (judgement.verdict, judgement.action) == ("fail", "rollback")
    assert running_canary.state == "rolled_back"
    guard = next(g for g in judgement.evidence["guards"] if g["name"] == "ttft_p95_ratio")
    assert guard == {"name": "ttft_p95_ratio", "value": 5.0, "limit": 3.0, "passed": False}


@pytest.mark.django_db
def test_a_candidate_that_falls_back_too_often_is_rolled_back(running_canary):
    """Fallbacks counted in the rollups reach the judge: the canary rolls back on them."""
    feed(running_canary, arm(0.5), arm(0.5, fallbacks=150))
    judgement = judged(running_canary.pk)
    running_canary.refresh_from_db()
    assert (judgement.verdict, judgement.action) == ("fail", "rollback")
    assert running_canary.state == "rolled_back"
    guard = next(g for g in judgement.evidence["guards"] if g["name"] == "hotspot_fallback_rate")
    assert guard == {"name": "hotspot_fallback_rate", "value": 0.75, "limit": 0.5, "passed": False}
    assert judgement.evidence["arms"]["candidate"]["hotspot_fallbacks"] == 150


def test_worse_but_not_significant_is_inconclusive():
    few = Guardrails(min_samples=3)
    baseline = ArmSample(requests=3, ttft_s=[0.5, 0.9, 0.4], tpot_s=[0.02] * 3)
    candidate = ArmSample(requests=3, ttft_s=[0.6, 0.3, 1.0], tpot_s=[0.02] * 3)
    assert judge({"baseline": baseline, "candidate": candidate}, few).verdict == "inconclusive"


def test_an_empty_arm_is_no_data_even_when_a_stored_canary_requires_no_samples():
    # min_samples 0, as canaries created before it had to be at least 1 may have it stored
    none_required = Guardrails.of_stored({"min_samples": 0})
    candidate = ArmSample(requests=3, ttft_s=[0.5, 0.6, 0.7])  # one-token answers: no TPOT
    verdict = judge({"baseline": arm(0.5), "candidate": candidate}, none_required)
    tpot = next(t for t in verdict.tests if t.metric == "tpot")
    assert (tpot.outcome, tpot.median_candidate, tpot.p_value) == ("no_data", None, None)
    json.dumps(verdict.evidence(), allow_nan=False)  # stored as JSON: no NaN


def test_a_stored_min_samples_of_0_never_passes_a_step_without_data():
    """A canary stored with min_samples 0 once passed a step whose baseline arm served
    nothing (its guard held at 0 samples, its tests had no data, so nothing failed)."""
    stored = Guardrails.of_stored({"min_samples": 0})
    assert stored.min_samples == 1
    verdict = judge({"baseline": ArmSample(), "candidate": arm(0.5)}, stored)
    assert verdict.verdict == "halt"
    assert verdict.guards[0].passed is False


@pytest.fixture
def running_canary(db):
    return make_running_canary("judge", guardrails={"max_failures": 0})


@pytest.mark.django_db
def test_pass_advances_the_weight_step_with_a_new_config(running_canary):
    versions_before = ConfigVersion.objects.count()
    feed(running_canary, arm(0.5), arm(0.5))
    judgement = judged(running_canary.pk)
    running_canary.refresh_from_db()
    assert (judgement.verdict, judgement.action) == ("pass", "advance")
    assert running_canary.step_index == 1 and running_canary.candidate_weight == 50
    assert ConfigVersion.objects.count() == versions_before + 1
    audit = AuditEvent.objects.filter(action="canary.advance").get()
    assert audit.actor_name == "system:canary-judge"
    assert audit.after is not None and audit.after["evidence"]["tests"][0]["n_candidate"] == 200


@pytest.mark.django_db
def test_regression_past_the_failure_limit_rolls_back(running_canary):
    feed(running_canary, arm(0.5), arm(1.0))
    judgement = judged(running_canary.pk)
    running_canary.refresh_from_db()
    assert (judgement.verdict, judgement.action) == ("fail", "rollback")
    assert running_canary.state == "rolled_back"
    latest = ConfigVersion.objects.filter(cluster=running_canary.cluster).first()
    assert (
        latest is not None and latest.document["canary"] is None
    )  # traffic back on the baseline policy


@pytest.mark.django_db
def test_too_little_data_waits_at_the_current_weight(running_canary):
    feed(running_canary, arm(0.5, n=25), arm(0.5, n=25))
    judgement = judged(running_canary.pk)
    running_canary.refresh_from_db()
    assert (judgement.verdict, judgement.action) == ("halt", "wait")
    assert (running_canary.state, running_canary.step_index) == ("progressing", 0)


@pytest.mark.django_db
def test_an_arm_with_no_sample_yet_is_waited_for_not_paused_at_the_first_check(running_canary):
    """The first check of a step can come before any candidate request has finished (the
    walkthrough's 15 s steps on a slowed demo): no rate to project from is no verdict that
    the samples cannot come."""
    feed(running_canary, arm(0.5, n=12), ArmSample(), step_age=timedelta(seconds=150))
    judgement = judged(running_canary.pk)
    running_canary.refresh_from_db()
    assert (judgement.verdict, judgement.action) == ("halt", "wait")
    assert running_canary.state == "progressing"
    reason = judgement.evidence["reasons"][-1]
    assert (
        "no samples on the candidate arm yet" in reason and "up to max_wait_seconds 600" in reason
    )


@pytest.mark.django_db
def test_no_data_until_max_wait_pauses_for_the_operator(running_canary):
    feed(running_canary, ArmSample(), ArmSample(), step_age=timedelta(seconds=601))
    judgement = judged(running_canary.pk)
    running_canary.refresh_from_db()
    assert (judgement.verdict, judgement.action) == ("halt", "pause")
    assert running_canary.state == "paused"
    assert (
        "no samples on the baseline and candidate arm by max_wait_seconds 600"
        in (judgement.evidence["reasons"][-1])
    )


@pytest.mark.django_db
def test_not_judged_before_the_step_has_run(running_canary):
    assert judge_canary(running_canary.pk) is None


@pytest.mark.django_db
def test_every_judgement_is_kept_with_its_evidence(running_canary):
    """Wait, advance, promote: three rows, none overwritten, each with what it rested on."""
    feed(running_canary, arm(0.5, n=25), arm(0.5, n=25))
    judge_canary(running_canary.pk)
    faster: dict[str, Any] = {"ttft_median": 0.4, "tpot_median": 0.016}  # passes whatever the draw
    feed(running_canary, arm(0.5), arm(errors=1, **faster))
    judge_canary(running_canary.pk)
    feed(running_canary, arm(0.5), arm(**faster))
    judge_canary(running_canary.pk)
    running_canary.refresh_from_db()
    assert running_canary.state == "promoted"

    rows = list(running_canary.judgements.order_by("at", "id"))
    assert [(j.verdict, j.action, j.step_index) for j in rows] == [
        ("halt", "wait", 0),
        ("pass", "advance", 0),
        ("pass", "promote", 1),
    ]
    assert [j.evidence["candidate_weight"] for j in rows] == [10, 10, 50]
    halted, advanced, promoted = (j.evidence for j in rows)
    assert halted["arms"]["candidate"]["requests"] == 25
    assert {g["name"]: g["passed"] for g in halted["guards"]} == {
        "min_samples": False,
        "error_rate": True,
        "hotspot_fallback_rate": True,
        "ttft_p95_ratio": None,
    }
    assert halted["tests"][0]["p_value"] is None  # too few samples: no test was run
    assert advanced["arms"] == {
        arm_name: {
            "requests": 200,
            "errors": errors,
            "hotspot_fallbacks": 0,
            "ttft_samples": 200,
            "tpot_samples": 200,
        }
        for arm_name, errors in (("baseline", 0), ("candidate", 1))
    }
    error_guard = next(g for g in advanced["guards"] if g["name"] == "error_rate")
    assert error_guard == {"name": "error_rate", "value": 0.005, "limit": 0.02, "passed": True}
    ttft = next(t for t in promoted["tests"] if t["metric"] == "ttft")
    assert ttft["n_baseline"] == ttft["n_candidate"] == 200
    assert 0.4 < ttft["median_baseline"] < 0.6 and 0.3 < ttft["median_candidate"] < 0.5
    assert ttft["effect"] < 0 and 0 <= ttft["p_value"] <= 1
    assert promoted["reasons"] == ["no regression beyond tolerance"]


@pytest.mark.django_db
def test_a_slow_arm_that_will_get_there_is_waited_for_then_promoted(running_canary):
    """The demo's case: 42 candidate samples after 190 s of a 60 s step (3.2 step lengths),
    50 needed. The measured rate (0.22/s) brings the rest in about 36 s, well inside
    max_wait_seconds, so the judge waits (a fixed three step lengths paused here), and
    promotes once the samples are in."""
    CanarySplit.objects.filter(pk=running_canary.pk).update(weight_steps=[25])
    feed(running_canary, arm(0.5, n=130), arm(0.5, n=42), step_age=timedelta(seconds=190))
    judgement = judged(running_canary.pk)
    assert (judgement.verdict, judgement.action) == ("halt", "wait")
    waiting = judgement.evidence["patience"]
    assert waiting["samples"] == {"baseline": 130, "candidate": 42}
    assert 30 < waiting["expected_in_s"] < 40  # 8 more at 42 / 190 s
    assert "expected in about 36 s" in judgement.evidence["reasons"][-1]

    faster: dict[str, Any] = {"ttft_median": 0.4, "tpot_median": 0.016}  # passes whatever the draw
    feed(running_canary, arm(0.5, n=140), arm(n=52, **faster), step_age=timedelta(seconds=230))
    assert judged(running_canary.pk).action == "promote"
    running_canary.refresh_from_db()
    assert running_canary.state == "promoted"


def unsettled(n: int) -> tuple[ArmSample, ArmSample]:
    """Arms whose candidate median is 30% worse with a spread that n samples cannot call
    significant: the walkthrough's case of a few noisy samples per arm."""
    spread = [0.2, 0.5, 1.6, 0.3, 2.4, 0.4, 0.9, 0.25]
    ttft_b = [spread[i % 8] for i in range(n)]
    ttft_c = [t * 1.3 for t in reversed(ttft_b)]
    return (
        ArmSample(requests=n, ttft_s=ttft_b, tpot_s=[0.02] * n),
        ArmSample(requests=n, ttft_s=ttft_c, tpot_s=[0.02] * n),
    )


def few_samples(canary: CanarySplit) -> None:
    CanarySplit.objects.filter(pk=canary.pk).update(
        guardrails={"max_failures": 0, "min_samples": 8}
    )


@pytest.mark.django_db
def test_an_inconclusive_step_waits_for_more_samples_then_is_settled(running_canary):
    """Not significant is not settled: the step stays at its weight, nobody paged, and a
    later check on more samples decides it (here a clear regression: rolled back)."""
    few_samples(running_canary)
    feed(running_canary, *unsettled(8), step_age=timedelta(seconds=150))
    judgement = judged(running_canary.pk)
    assert (judgement.verdict, judgement.action) == ("inconclusive", "wait")
    assert "waiting for more samples" in judgement.evidence["reasons"][-1]
    running_canary.refresh_from_db()
    assert (running_canary.state, running_canary.step_index) == ("progressing", 0)
    assert not AuditEvent.objects.filter(action="canary.pause").exists()

    feed(running_canary, arm(0.5), arm(0.9), step_age=timedelta(seconds=200))
    assert judged(running_canary.pk).action == "rollback"  # max_failures 0


@pytest.mark.django_db
def test_an_inconclusive_step_past_max_wait_pauses_for_the_operator(running_canary):
    few_samples(running_canary)
    feed(running_canary, *unsettled(8), step_age=timedelta(seconds=601))
    judgement = judged(running_canary.pk)
    assert (judgement.verdict, judgement.action) == ("inconclusive", "pause")
    running_canary.refresh_from_db()
    assert running_canary.state == "paused"
    pause = AuditEvent.objects.get(action="canary.pause")
    assert "still unsettled at max_wait_seconds 600" in pause.reason


@pytest.mark.django_db
def test_an_arm_too_slow_to_get_there_pauses_with_the_numbers(running_canary):
    """5 samples in 190 s: 45 more would take about 1,700 s, past max_wait_seconds (600)."""
    feed(running_canary, arm(0.5, n=130), arm(0.5, n=5), step_age=timedelta(seconds=190))
    judgement = judged(running_canary.pk)
    assert (judgement.verdict, judgement.action) == ("halt", "pause")
    reason = judgement.evidence["reasons"][-1]
    assert "candidate 5 (0.03/s)" in reason and "past max_wait_seconds 600" in reason
    running_canary.refresh_from_db()
    assert running_canary.state == "paused"
    pause = AuditEvent.objects.get(action="canary.pause")
    assert "past max_wait_seconds 600" in pause.reason


@pytest.mark.django_db
def test_a_baseline_median_of_zero_does_not_hide_a_slow_candidate(running_canary):
    """A zero baseline median made the effect 0, so a 30 s candidate passed."""
    zero = ArmSample(requests=200, ttft_s=[0.0] * 200, tpot_s=[0.0] * 200)
    slow = ArmSample(requests=200, ttft_s=[30.0] * 200, tpot_s=[0.02] * 200)
    verdict = judge({"baseline": zero, "candidate": slow}, Guardrails())
    assert verdict.verdict == "fail"
    effect = next(t for t in verdict.tests if t.metric == "ttft").effect
    assert effect is not None and effect > 1000


@pytest.mark.django_db
def test_one_canary_the_judge_cannot_judge_does_not_stop_the_others(running_canary):
    """A step_seconds stored before it was bounded (1e14) overflowed the judge's date
    arithmetic, and any error stopped the pass: the canaries after it were never judged.
    The judge now reads such a step as not due, and records any other error on the canary's
    own timeline and goes on."""
    from controlplane.services.judge import judge_progressing

    broken = make_running_canary("judge-2", instances=2, base_port=9200, weight_steps=[10])
    # Guardrails as an older release or a hand edit left them: a step_seconds of 1e14
    # (overflowed the step's timedelta) and a min_samples that is not a number (raises
    # inside the judgement).
    CanarySplit.objects.filter(pk=broken.pk).update(
        guardrails={**broken.guardrails, "step_seconds": 1e14},
        step_started_at=timezone.now() - timedelta(days=400_000),
    )
    feed(running_canary, arm(0.5), arm(0.5))
    assert judge_progressing().verdicts == {running_canary.pk: "pass", broken.pk: None}

    CanarySplit.objects.filter(pk=broken.pk).update(
        guardrails={**broken.guardrails, "min_samples": "lots"}
    )
    CanarySplit.objects.filter(pk=running_canary.pk).update(step_index=0)
    feed(running_canary, arm(0.5), arm(0.5))
    run = judge_progressing()
    assert run.verdicts == {running_canary.pk: "pass"}
    assert list(run.skipped) == [broken.pk]
    error = broken.judgements.get()
    assert (error.verdict, error.action) == ("error", "skipped")
    assert "not judged" in error.evidence["reasons"][0]


@pytest.mark.django_db
def test_guardrails_beyond_their_limits_are_refused(running_canary):
    from controlplane.services.errors import ServiceError

    for key, value in (
        ("step_seconds", 1e14),
        ("max_wait_seconds", 1e9),
        ("p_value", 2),
        ("max_error_rate", 1.5),
        ("max_wait_seconds", 30),  # below step_seconds (60): never judged before it
    ):
        with pytest.raises(ServiceError) as refused:
            validate_guardrails({key: value}, Guardrails())
        assert refused.value.field == f"guardrails.{key}"


def test_consecutive_halts_of_a_step_collapse_into_one_timeline_row():
    from controlplane.models import CanaryJudgement
    from controlplane.selectors.canaries import timeline

    def j(step: int, verdict: str, action: str) -> CanaryJudgement:
        return CanaryJudgement(step_index=step, verdict=verdict, action=action)

    rows = timeline(
        [j(0, "halt", "wait")] * 12
        + [j(0, "halt", "pause")]
        + [j(0, "halt", "wait")] * 2
        + [j(0, "pass", "advance"), j(1, "halt", "wait"), j(1, "fail", "retry")]
        + [j(1, "fail", "retry")]
    )
    assert [(r.last.verdict, r.last.action, r.count) for r in rows] == [
        ("halt", "wait", 12),
        ("halt", "pause", 1),
        ("halt", "wait", 2),
        ("pass", "advance", 1),
        ("halt", "wait", 1),
        ("fail", "retry", 1),
        ("fail", "retry", 1),
    ]
