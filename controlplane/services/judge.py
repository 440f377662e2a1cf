"""The canary judge (after Flagger, Argo Rollouts and Kayenta).

Each step: hard guards first (candidate error rate, hotspot-fallback rate; too few samples
halts — no data is never a pass), then a one-sided Mann–Whitney U test per latency metric
(is the candidate's TTFT/TPOT stochastically greater than the baseline's?) with an effect
size tolerance on the relative change of medians:

* significant (p < α) and worse beyond tolerance → fail
* not significant but the medians differ beyond tolerance → inconclusive
* otherwise → pass

Pass advances the weight step (promotes after the last); fail counts against
`max_failures` and rolls back past it. Inconclusive is a question more samples answer: the
step waits at its weight, each check judging all its samples so far, until a test settles
it or `max_wait_seconds` from the step's start runs out; then it pauses for the operator.
Halt (too few samples) waits at the current weight while the arms' measured sample rates say
`min_samples` arrives within `max_wait_seconds` of the step's start, and pauses for the
operator, with the rates and the projection, once they say it cannot; an arm with no sample
yet (nothing to project from: its first requests may still be running) is waited for until
`max_wait_seconds`. Every judgement is
stored with its evidence; every action that changes the canary is audited. One canary the
judge cannot judge (a service error, a record it cannot read) is reported and skipped; the
others are still judged.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from controlplane.models import ArmMetricRollup, CanaryJudgement, CanarySplit
from engine_interface import percentile

from . import canaries
from .audit import Actor
from .guardrails import Guardrails

log = logging.getLogger(__name__)
JUDGE = Actor.system("canary-judge")
ARMS = ("baseline", "candidate")
# The smallest median the relative effect divides by: a baseline median of 0 (or below,
# from a bad record) must not make every candidate look unchanged.
MEDIAN_FLOOR_S = 1e-3


@dataclass
class ArmSample:
    requests: int = 0
    errors: int = 0
    hotspot_fallbacks: int = 0
    ttft_s: list[float] = field(default_factory=list)
    tpot_s: list[float] = field(default_factory=list)


@dataclass
class MetricTest:
    metric: str
    n_baseline: int
    n_candidate: int
    median_baseline: float | None
    median_candidate: float | None
    effect: float | None  # relative change of the candidate's median
    p_value: float | None
    outcome: str  # pass | fail | inconclusive | no_data


@dataclass
class Guard:
    """One hard guard of a step: its measured value against its limit."""

    name: str  # "min_samples" or a key of GUARD_LABELS
    value: float | None
    limit: float
    passed: bool | None  # None: not measurable (the candidate served no request)


@dataclass
class Verdict:
    verdict: str  # pass | fail | inconclusive | halt
    reasons: list[str]
    tests: list[MetricTest]
    guards: list[Guard]
    arms: dict[str, dict[str, int]] = field(default_factory=dict)

    def evidence(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "reasons": self.reasons,
            "arms": self.arms,
            "guards": [asdict(g) for g in self.guards],
            "tests": [asdict(t) for t in self.tests],
        }


def compare(
    metric: str, baseline: list[float], candidate: list[float], guardrails: Guardrails
) -> MetricTest:
    # Imported here: a router host's `routers` worker loads this module (with every task
    # module) but never judges, and installs no scipy (pyproject's `supervisor` extra).
    from scipy.stats import mannwhitneyu

    n_b, n_c = len(baseline), len(candidate)
    if min(n_b, n_c) < guardrails.min_samples:  # at least 1: an empty arm has no median
        return MetricTest(metric, n_b, n_c, None, None, None, None, "no_data")
    med_b, med_c = percentile(baseline, 50), percentile(candidate, 50)
    assert med_b is not None and med_c is not None  # each arm holds a sample
    effect = (med_c - med_b) / max(med_b, MEDIAN_FLOOR_S)
    p_value = float(mannwhitneyu(candidate, baseline, alternative="greater").pvalue)
    worse = effect > guardrails.effect_tolerance
    if worse and p_value < guardrails.p_value:
        outcome = "fail"
    elif worse:
        outcome = "inconclusive"
    else:
        outcome = "pass"
    return MetricTest(metric, n_b, n_c, med_b, med_c, effect, p_value, outcome)


GUARD_LABELS = {
    "error_rate": "error rate",
    "hotspot_fallback_rate": "hotspot fallback rate",
    "ttft_p95_ratio": "TTFT p95 ratio",
}
TAIL_PERCENTILE = 95


def usable_samples(sample: ArmSample) -> int:
    """Samples an arm has for both tests (a request with one output token has no TPOT)."""
    return min(len(sample.ttft_s), len(sample.tpot_s))


def guards_of(samples: dict[str, ArmSample], guardrails: Guardrails) -> list[Guard]:
    """The step's hard guards, each with its value, its limit and whether it held."""
    candidate = samples["candidate"]
    fewest = min(usable_samples(s) for s in samples.values())
    guards = [
        Guard(
            "min_samples",
            fewest,
            guardrails.min_samples,
            bool(candidate.requests) and fewest >= guardrails.min_samples,
        )
    ]
    for name, count in (
        ("error_rate", candidate.errors),
        ("hotspot_fallback_rate", candidate.hotspot_fallbacks),
    ):
        limit = getattr(guardrails, f"max_{name}")
        rate = count / candidate.requests if candidate.requests else None
        guards.append(Guard(name, rate, limit, None if rate is None else rate <= limit))
    guards.append(tail_guard(samples, guardrails))
    return guards


def tail_guard(samples: dict[str, ArmSample], guardrails: Guardrails) -> Guard:
    """The candidate's p95 TTFT against the baseline's; no value (not judged) until both
    arms hold min_samples TTFT samples: a p95 of a handful of requests is their maximum."""
    baseline, candidate = samples["baseline"].ttft_s, samples["candidate"].ttft_s
    limit = guardrails.max_ttft_p95_ratio
    if min(len(baseline), len(candidate)) < guardrails.min_samples:
        return Guard("ttft_p95_ratio", None, limit, None)
    tail_b = percentile(baseline, TAIL_PERCENTILE)
    tail_c = percentile(candidate, TAIL_PERCENTILE)
    assert tail_b is not None and tail_c is not None  # each arm holds min_samples >= 1
    ratio = tail_c / max(tail_b, MEDIAN_FLOOR_S)
    return Guard("ttft_p95_ratio", ratio, limit, ratio <= limit)


def arm_counts(samples: dict[str, ArmSample]) -> dict[str, dict[str, int]]:
    return {
        name: {
            "requests": s.requests,
            "errors": s.errors,
            "hotspot_fallbacks": s.hotspot_fallbacks,
            "ttft_samples": len(s.ttft_s),
            "tpot_samples": len(s.tpot_s),
        }
        for name, s in samples.items()
    }


def judge(samples: dict[str, ArmSample], guardrails: Guardrails) -> Verdict:
    """Pure decision on one step's samples (no database access)."""
    baseline, candidate = samples["baseline"], samples["candidate"]
    guards, arms = guards_of(samples, guardrails), arm_counts(samples)
    tests = [
        compare("ttft", baseline.ttft_s, candidate.ttft_s, guardrails),
        compare("tpot", baseline.tpot_s, candidate.tpot_s, guardrails),
    ]
    if not guards[0].passed:
        return Verdict(
            "halt",
            [f"too few samples to judge (min_samples {guardrails.min_samples:g} per arm)"],
            tests,
            guards,
            arms,
        )
    reasons = [
        f"{GUARD_LABELS[g.name]} {g.value:.3f} > {g.limit:g}"
        for g in guards[1:]
        if g.passed is False and g.value is not None
    ]
    reasons += [
        f"{t.metric} median {t.effect:+.1%} (p={t.p_value:.3g})"
        for t in tests
        if t.outcome == "fail"
    ]
    if reasons:
        return Verdict("fail", reasons, tests, guards, arms)
    unsure = [
        f"{t.metric} median {t.effect:+.1%} but not significant (p={t.p_value:.3g})"
        for t in tests
        if t.outcome == "inconclusive"
    ]
    if unsure:
        return Verdict("inconclusive", unsure, tests, guards, arms)
    return Verdict("pass", ["no regression beyond tolerance"], tests, guards, arms)


def step_samples(canary: CanarySplit) -> dict[str, ArmSample]:
    rows = ArmMetricRollup.objects.filter(
        cluster=canary.cluster,
        arm__in=ARMS,
        minute__gte=(canary.step_started_at or canary.created_at).replace(second=0, microsecond=0),
    )
    samples = {arm: ArmSample() for arm in ARMS}
    for row in rows:
        arm = samples[row.arm]
        arm.requests += row.requests
        arm.errors += row.errors
        arm.hotspot_fallbacks += row.hotspot_fallbacks
        arm.ttft_s += row.ttft_samples
        arm.tpot_s += row.tpot_samples
    return samples


@dataclass
class Patience:
    """When a halted step is expected to have ``min_samples`` per arm, at the sample rates
    each arm has shown since the step started."""

    step_age_s: float
    max_wait_s: float
    samples: dict[str, int]
    rates_per_s: dict[str, float]
    expected_in_s: float | None  # None: an arm short of samples has none yet, so no rate

    @property
    def wait(self) -> bool:
        if self.expected_in_s is None:
            # An arm without a sample yet gives no rate to project from (its first requests
            # may still be running): it is waited for up to max_wait_seconds, not judged
            # hopeless at the first check.
            return self.step_age_s < self.max_wait_s
        return self.step_age_s + self.expected_in_s <= self.max_wait_s

    def explain(self, min_samples: float) -> str:
        counts = ", ".join(
            f"{arm} {n} ({self.rates_per_s[arm]:.2f}/s)" for arm, n in self.samples.items()
        )
        seen = f"after {self.step_age_s:.0f} s: {counts}"
        if self.expected_in_s is None:
            empty = " and ".join(arm for arm, n in self.samples.items() if n == 0)
            if self.wait:
                return (
                    f"{seen}; no samples on the {empty} arm yet: waiting up to "
                    f"max_wait_seconds {self.max_wait_s:g} from the step's start"
                )
            return f"{seen}; no samples on the {empty} arm by max_wait_seconds {self.max_wait_s:g}"
        when = f"{min_samples:g} per arm expected in about {self.expected_in_s:.0f} s"
        if self.wait:
            return f"{seen}; {when} at these rates"
        return (
            f"{seen}; at these rates {when}, past max_wait_seconds {self.max_wait_s:g} "
            "from the step's start"
        )


def more_samples(waiting: Patience) -> str:
    """What an inconclusive step does next: wait for the samples that may settle it, or,
    past ``max_wait_seconds``, pause for the operator."""
    seen = ", ".join(f"{arm} {n}" for arm, n in waiting.samples.items())
    if waiting.step_age_s < waiting.max_wait_s:
        return (
            f"after {waiting.step_age_s:.0f} s ({seen} samples): waiting for more samples "
            f"to settle it, up to max_wait_seconds {waiting.max_wait_s:g} from the step's start"
        )
    return (
        f"after {waiting.step_age_s:.0f} s ({seen} samples): still unsettled at "
        f"max_wait_seconds {waiting.max_wait_s:g}"
    )


def patience(samples: dict[str, ArmSample], step_age_s: float, guardrails: Guardrails) -> Patience:
    """Project, from each arm's samples so far, when every arm reaches ``min_samples``."""
    counts = {arm: usable_samples(s) for arm, s in samples.items()}
    age = max(step_age_s, 1e-9)
    rates = {arm: n / age for arm, n in counts.items()}
    need = guardrails.min_samples
    etas = [
        0.0 if n >= need else (need - n) / rates[arm] if n else math.inf
        for arm, n in counts.items()
    ]
    expected = max(etas)
    return Patience(
        step_age_s=step_age_s,
        max_wait_s=guardrails.max_wait_seconds,
        samples=counts,
        rates_per_s=rates,
        expected_in_s=expected if math.isfinite(expected) else None,
    )


def step_age(canary: CanarySplit) -> timedelta:
    return timezone.now() - (canary.step_started_at or canary.created_at)


def due(canary: CanarySplit) -> bool:
    # Compared in float seconds: a timedelta of a stored huge step_seconds would overflow.
    return step_age(canary).total_seconds() >= canaries.guardrails_of(canary).step_seconds


def expected_verdict(canary: CanarySplit) -> Patience | None:
    """For a progressing canary's page: when its current step can be judged, at the
    measured rates (None when the canary is not progressing)."""
    if canary.state != CanarySplit.State.PROGRESSING:
        return None
    guardrails = canaries.guardrails_of(canary)
    return patience(step_samples(canary), step_age(canary).total_seconds(), guardrails)


@dataclass
class JudgeRun:
    """What one pass of the judge did: each progressing canary's verdict (None: not due),
    and the canaries it could not judge, with why."""

    verdicts: dict[int, str | None] = field(default_factory=dict)
    skipped: dict[int, str] = field(default_factory=dict)


def judge_progressing() -> JudgeRun:
    """Judge every progressing canary, each on its own: one that raises is logged, recorded
    as an ``error`` judgement on its timeline and skipped, and the others are still judged."""
    run = JudgeRun()
    ids = CanarySplit.objects.filter(state=CanarySplit.State.PROGRESSING).values_list(
        "pk", flat=True
    )
    for canary_id in list(ids):
        try:
            judgement = judge_canary(canary_id)
        except Exception as error:  # one canary must not stop the others
            log.exception("canary %s could not be judged", canary_id)
            run.skipped[canary_id] = f"{type(error).__name__}: {error}"[:500]
            _record_error(canary_id, run.skipped[canary_id])
            continue
        run.verdicts[canary_id] = judgement.verdict if judgement else None
    return run


ERROR_REPEAT_S = 600.0  # a judge error that persists is written again this often, not every run


def _record_error(canary_id: int, reason: str) -> None:
    """An ``error`` judgement on the canary's timeline; the same error on the same step,
    already written within `ERROR_REPEAT_S`, is not written again (the judge runs every
    10 s: a canary it cannot judge would gain a row each time, for ever)."""
    try:
        canary = CanarySplit.objects.get(pk=canary_id)
        newest = canary.judgements.order_by("-at", "-pk").first()
        reasons = [f"not judged: {reason}"]
        if (
            newest is not None
            and (newest.verdict, newest.step_index) == ("error", canary.step_index)
            and newest.evidence.get("reasons") == reasons
            and (timezone.now() - newest.at).total_seconds() < ERROR_REPEAT_S
        ):
            return
        CanaryJudgement.objects.create(
            canary=canary,
            step_index=canary.step_index,
            verdict="error",
            action="skipped",
            evidence={"verdict": "error", "reasons": reasons},
        )
    except Exception:  # already logged above; the run goes on
        log.exception("could not record the judge's error on canary %s", canary_id)


def judge_canary(canary_id: int) -> CanaryJudgement | None:
    """Judge a progressing canary whose step has run long enough; act on the verdict.
    Under the canary's row lock (taken as every canary service takes it): a second judge
    running at once waits, then finds the step already acted on (not due) and does nothing,
    so no step is skipped and no failure counted twice."""
    with transaction.atomic():
        canary = canaries._locked_canary(canary_id)
        if canary.state != CanarySplit.State.PROGRESSING or not due(canary):
            return None
        guardrails = canaries.guardrails_of(canary)
        samples = step_samples(canary)
        verdict = judge(samples, guardrails)
        waiting = patience(samples, step_age(canary).total_seconds(), guardrails)
        if verdict.verdict == "halt":
            verdict.reasons.append(waiting.explain(guardrails.min_samples))
        elif verdict.verdict == "inconclusive":
            verdict.reasons.append(more_samples(waiting))
        # The step as it was judged: _act may move the canary to the next one.
        evidence = {
            **verdict.evidence(),
            "step_index": canary.step_index,
            "candidate_weight": canary.candidate_weight,
            "step_started_at": (canary.step_started_at or canary.created_at).isoformat(),
        }
        if verdict.verdict == "halt":
            evidence["patience"] = asdict(waiting)
        action = _act(canary, verdict, evidence, waiting, guardrails)
        return CanaryJudgement.objects.create(
            canary=canary,
            step_index=evidence["step_index"],
            verdict=verdict.verdict,
            action=action,
            evidence=evidence,
        )


def _act(
    canary: CanarySplit,
    verdict: Verdict,
    evidence: dict[str, Any],
    waiting: Patience,
    guardrails: Guardrails,
) -> str:
    reason = f"canary judge: {verdict.verdict}: {'; '.join(verdict.reasons)}"
    if verdict.verdict == "pass":
        if canary.step_index + 1 < len(canary.weight_steps):
            canaries.advance_step(JUDGE, canary.pk, reason=reason, evidence=evidence)
            return "advance"
        canaries.transition(JUDGE, canary.pk, "promote", reason=reason, evidence=evidence)
        return "promote"
    if verdict.verdict == "fail":
        failures = canaries.count_failure(JUDGE, canary.pk, reason=reason, evidence=evidence)
        if failures > guardrails.max_failures:
            canaries.transition(JUDGE, canary.pk, "rollback", reason=reason, evidence=evidence)
            return "rollback"
        return "retry"
    if verdict.verdict == "halt" and waiting.wait:
        return "wait"
    if verdict.verdict == "inconclusive" and waiting.step_age_s < waiting.max_wait_s:
        return "wait"
    canaries.transition(JUDGE, canary.pk, "pause", reason=reason, evidence=evidence)
    return "pause"
