"""What the live router does per request beside the lifecycle's own accounting.

Each concern is a ``LifecycleObserver[Plan]`` that :class:`~router_worker.core.RouterCore`
attaches to every request's :class:`~router_worker.plan.Plan` (the request's lifecycle).
The lifecycle tells each one of every transition once, so no step of the request path has
to remember them, and none of those steps reaches into the metrics or the health book:

* :class:`Hotspots`: the hotspot transitions a decision raised (telemetry events, and
  the confirmed ones the snapshot shows);
* :class:`Breaker`: each instance's circuit breaker (the health book), told of failures
  before the retry is decided, and of good answers;
* :class:`FailureLog`: failed attempts and retries counted and logged, and a request given
  up reported as a telemetry event;
* :class:`~router_worker.routing.peer_accounting.PeerReports` (shared with the simulator):
  this router's requests, told to its peers (replica sync);
* :class:`RequestMetrics`: the per-request Prometheus metrics (stage times included);
* :class:`SplitCounts`: the decider's splits and the splits that fell back (the live
  view's split ratio);
* :class:`LoadPeaks`: the highest pending prefill and batch per instance between
  telemetry snapshots;
* :class:`RequestSamples`: the telemetry sample of each request, and traffic capture;
* :class:`DecisionLog`: which decisions are sampled (as they are made), captured from the
  indicators they were made on, shipped to the live view, and the recent ones
  ``/admin/state`` shows;
* :class:`Migrations`: the registry of attempts a migrating policy may move.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

import numpy as np

from router_worker.contract.telemetry import DECIDER_RECENT, DecisionRecord, DisaggregationStats
from router_worker.decisions import (
    CapturedDecision,
    DecisionSampler,
    candidate_rows,
    capture,
    is_priority,
    scalar_details,
)
from router_worker.flow_gate import FlowGate
from router_worker.health import HealthBook
from router_worker.metrics import RouterMetrics
from router_worker.plan import Outcome, Plan
from router_worker.routing import (
    Attempt,
    ClusterState,
    HotspotTransition,
    LifecycleObserver,
    Phase,
    RequestLifecycle,
    choose_migrations,
)
from router_worker.telemetry import RequestSample, Telemetry
from router_worker.tracing import RequestTracer

log = logging.getLogger("router_worker")
RECENT_DECISIONS = 200
# Failure kinds that are resource limits: counted in switchyard_router_limit_hits_total.
LIMIT_KINDS = frozenset(
    {
        "bad_response",
        "event_too_large",
        "response_deadline",
        "response_too_large",
        "response_headers_too_large",
        "fd_exhausted",
    }
)


# Verdicts on an answer broken after its first byte: not a request given up unserved.
AFTER_FIRST_BYTE = frozenset({"first_byte", "not_continuable", "continuations_exhausted"})


class Hotspots(LifecycleObserver[Plan]):
    """Hotspot transitions raised by decisions: each one a telemetry event; the confirmed
    (not yet cleared) ones are ``active``."""

    __slots__ = ("active", "telemetry")

    def __init__(self, telemetry: Telemetry) -> None:
        self.telemetry = telemetry
        self.active: dict[str, HotspotTransition] = {}

    def routed(self, plan: Plan, attempt: Attempt) -> None:
        if attempt.decision is None:
            return
        for event in attempt.decision.events:
            if not isinstance(event, HotspotTransition):
                continue
            if event.kind == "confirmed":
                self.active[event.class_id] = event
            elif event.kind in ("cleared", "dismissed"):
                self.active.pop(event.class_id, None)
            self.telemetry.event("hotspot", **hotspot_payload(event))


class Breaker(LifecycleObserver[Plan]):
    """Each instance's circuit breaker (:class:`HealthBook`).

    A failed attempt strikes its instance before the retry is decided (so an instance
    that refused a connection is out of the retry's choice), unless it was ``final`` (no
    fault of the instance's) or a 5xx: a 5xx may be the request's own doing, so the
    instances that answered one are struck when the request closes, and only if it was
    served elsewhere after all or given up, not when it was taken for the cause (the
    poison rule) or refused by the engine. A good answer (a first token, or an answer
    finished) clears its instance."""

    __slots__ = ("health",)

    def __init__(self, health: HealthBook) -> None:
        self.health = health

    def failed(self, plan: Plan, attempt: Attempt) -> None:
        kind = attempt.error or "unknown"
        if attempt.final or kind == "http_5xx":
            return
        fatal = kind == "connect"  # the instance is certainly gone (connection refused)
        self.health.record_failure(attempt.instance, time.monotonic(), kind, fatal=fatal)

    def first_token(self, plan: Plan, attempt: Attempt) -> None:
        self.health.record_success(attempt.instance)

    def ended(self, plan: Plan, attempt: Attempt) -> None:
        if attempt.phase is Phase.FINISHED and attempt.first_token_at is None:
            self.health.record_success(attempt.instance)

    def closed(self, plan: Plan, outcome: Outcome) -> None:
        if not plan.answered_5xx or not _settles_5xx(plan):
            return
        now = time.monotonic()
        for instance in plan.answered_5xx:
            self.health.record_failure(instance, now, "http_5xx")


def _settles_5xx(plan: Plan) -> bool:
    """Whether the 5xx answers of a closed request are held against their instances: it
    was served (a token, or an answer, came back) or given up other than by the poison
    rule."""
    if any(a.first_token_at is not None or a.phase is Phase.FINISHED for a in plan.attempts):
        return True
    verdict = plan.verdict
    return plan.current.phase is Phase.FAILED and verdict is not None and verdict.why != "poison"


class FailureLog(LifecycleObserver[Plan]):
    """Failed attempts counted (``upstream_errors_total{instance,kind}``, and the limit
    hits among them) and logged, retries counted, and a request given up before its first
    byte reported as a ``retries_exhausted`` telemetry event."""

    __slots__ = ("metrics", "telemetry")

    def __init__(self, metrics: RouterMetrics, telemetry: Telemetry) -> None:
        self.metrics = metrics
        self.telemetry = telemetry

    def failed(self, plan: Plan, attempt: Attempt) -> None:
        kind = attempt.error or "unknown"
        m = self.metrics
        m.child(m.upstream_errors, attempt.instance, kind).inc()
        if kind in LIMIT_KINDS:
            m.limit_hit(kind)
        instance, detail = attempt.instance, attempt.detail
        log.info("request %s: %s on %s: %s", plan.request_id, kind, instance, detail)

    def routed(self, plan: Plan, attempt: Attempt) -> None:
        if attempt.reason == "retry":
            self.metrics.child(self.metrics.retries, attempt.instance).inc()
        elif attempt.reason == "continuation":
            self.metrics.child(self.metrics.continuations, attempt.instance).inc()

    def closed(self, plan: Plan, outcome: Outcome) -> None:
        verdict, last = plan.verdict, plan.current
        if verdict is None or verdict.retry or verdict.why in AFTER_FIRST_BYTE:
            return
        if last.phase is not Phase.FAILED:
            return
        self.telemetry.event(
            "retries_exhausted",
            request_id=plan.request_id,
            attempts=plan.attempt_count,
            last_error=f"{last.error}: {last.detail}",
            instances=plan.tried,
            request_suspected=verdict.why == "poison",
        )


class RequestMetrics(LifecycleObserver[Plan]):
    """The per-request metrics: the intake and decision times and the tokenization mode of each
    request once its first attempt is sent; TTFT, TPOT and ``requests_total{status}`` once
    it is closed.

    The labelled series a request lands in are looked up once per combination of labels
    and kept together: a request then costs one dict lookup per hook instead of one label
    resolution per series (four of them at dispatch, three at close)."""

    __slots__ = ("_closed", "_dispatched", "metrics")

    def __init__(self, metrics: RouterMetrics) -> None:
        self.metrics = metrics
        # (tokenization, policy) -> tokenize histogram, decision histogram, tokenizations
        self._dispatched: dict[tuple[str, str], tuple[Any, Any, Any]] = {}
        # (arm, policy, reason, status) -> ttft histogram, tpot histogram, requests counter
        self._closed: dict[tuple[str, str, str, int], tuple[Any, Any, Any]] = {}

    def dispatched(self, plan: Plan, attempt: Attempt) -> None:
        if plan.attempt_count != 1:
            return
        key = (plan.tokenization, plan.arm.policy_kind)
        series = self._dispatched.get(key)
        if series is None:
            m = self.metrics
            series = self._dispatched[key] = (
                m.child(m.tokenize_seconds, key[0]),
                m.child(m.decision_seconds, key[1]),
                m.child(m.tokenizations, key[0]),
            )
        tokenize_s, decision_s, tokenizations = series
        tokenize, hashing, decide = plan.timings
        tokenize_s.observe(tokenize)
        self.metrics.hashing_seconds.observe(hashing)
        decision_s.observe(decide)
        tokenizations.inc()

    def closed(self, plan: Plan, outcome: Outcome) -> None:
        arm = plan.arm
        key = (arm.name, arm.policy_kind, plan.reason, outcome.status)
        series = self._closed.get(key)
        if series is None:
            m = self.metrics
            series = self._closed[key] = (
                m.child(m.ttft, arm.name),
                m.child(m.tpot, arm.name),
                m.child(m.requests, arm.policy_kind, arm.name, plan.reason, str(outcome.status)),
            )
        ttft, tpot, requests = series
        if plan.split is not None:
            self.metrics.child(self.metrics.disaggregated, arm.name, plan.stage).inc()
        if outcome.ttft is not None:
            ttft.observe(outcome.ttft)
        if outcome.tpot is not None:
            tpot.observe(outcome.tpot)
        requests.inc()
        clock = plan.clock
        if clock is not None and clock.relayed:  # its first bytes reached the client
            self.metrics.stages.observe(clock)
            if plan.stream:  # the router's part of the time to the first event relayed
                relay = clock.relayed - clock.event
                self.metrics.overhead.observe(plan.sent_at - plan.started + relay)


class LoadPeaks(LifecycleObserver[Plan]):
    """The highest pending prefill and in-flight count of each instance (by slot) since
    the last telemetry snapshot: the batch (as policies see it) grows at dispatch, and
    in-flight is its upper bound."""

    __slots__ = ("peaks",)

    def __init__(self) -> None:
        self.peaks: dict[int, list[float]] = {}

    def dispatched(self, plan: Plan, attempt: Attempt) -> None:
        state = plan.state
        slot = state.slot_of(attempt.instance)
        peak = self.peaks.setdefault(slot, [0.0, 0.0])
        peak[0] = max(peak[0], float(state.pending[slot]))
        peak[1] = max(peak[1], float(state.in_flight[slot]))

    def take(self, state: ClusterState) -> dict[str, tuple[float, float, float]]:
        """Per instance: (pending prefill, batch, KV usage), peaks and now alike; the
        peaks start again."""
        peaks = {}
        batch_now = state.view().batch_size
        for slot, name in enumerate(state.ids):
            pending, batch = self.peaks.get(slot, (0.0, 0.0))
            kv = float(np.nan_to_num(state.kv_usage[slot]))
            peaks[name] = (
                max(pending, float(state.pending[slot])),
                max(batch, float(batch_now[slot])),
                kv,
            )
        self.peaks.clear()
        return peaks


class SplitCounts(LifecycleObserver[Plan]):
    """A disaggregated cluster's requests as the decider split them (the live view's split
    ratio, over the router's last `DECIDER_RECENT` requests and since it started) and the
    split ones that fell back to colocated (a prefill or decode stage failed: a KV read
    that failed among them)."""

    __slots__ = ("colocated", "fallbacks", "recent", "split")

    def __init__(self) -> None:
        self.split = self.colocated = self.fallbacks = 0
        self.recent: deque[bool] = deque(maxlen=DECIDER_RECENT)

    def closed(self, plan: Plan, outcome: Outcome) -> None:
        verdict = plan.split
        if verdict is None:
            return
        self.recent.append(verdict.split)
        if verdict.split:
            self.split += 1
            self.fallbacks += plan.stage == "fallback"
        else:
            self.colocated += 1

    def stats(self) -> DisaggregationStats:
        return DisaggregationStats(
            split=self.split,
            colocated=self.colocated,
            recent=len(self.recent),
            recent_split=sum(self.recent),
            fallbacks=self.fallbacks,
        )


class RequestSamples(LifecycleObserver[Plan]):
    """Each closed request as a telemetry sample, and as a captured request when the
    runtime's configuration captures traffic."""

    __slots__ = ("telemetry",)

    def __init__(self, telemetry: Telemetry) -> None:
        self.telemetry = telemetry

    def closed(self, plan: Plan, outcome: Outcome) -> None:
        arm = plan.arm
        self.telemetry.record(
            RequestSample(
                at=time.time(),
                arm=arm.name,
                policy=arm.policy_kind,
                instance=plan.instance or None,
                ok=outcome.ok or outcome.status < 500,
                ttft=outcome.ttft,
                tpot=outcome.tpot,
                output_tokens=outcome.output_tokens,
                prompt_tokens=plan.features.prompt_tokens,
                cached_tokens=outcome.cached_tokens,
                fallback=plan.decision.reason == "hotspot_fallback",
            )
        )
        config = plan.runtime.config.capture
        if config is not None:
            self.telemetry.capture.add(
                config,
                plan.features,
                output_tokens=outcome.output_tokens,
                instance=plan.instance,
                arm=arm.name,
                status=outcome.status,
                ttft_s=outcome.ttft,
                tpot_s=outcome.tpot,
            )


class DecisionLog(LifecycleObserver[Plan]):
    """Routing decisions for the live view and ``/admin/state``.

    A decision the sampler admitted when it was made (``plan.capture_due``) is copied with
    its indicators as the request is sent, before the dispatch is accounted: they are
    still those it was made on (no await since), and the copy is off the request's way to
    the engine. When the request is closed its decision is shipped if it was sampled, or
    if it was retried or failed on the serving side (admitted then, without indicators);
    every closed request joins the ``recent`` ones."""

    __slots__ = ("recent", "router", "sampler", "telemetry")

    def __init__(self, router: str, telemetry: Telemetry, sampler: DecisionSampler) -> None:
        self.router = router
        self.telemetry = telemetry
        self.sampler = sampler
        # The dicts (with their per-candidate score tables) are built only when
        # /admin/state asks: most entries leave the deque unread.
        self.recent: deque[tuple[Plan, int, float | None]] = deque(maxlen=RECENT_DECISIONS)

    def routed(self, plan: Plan, attempt: Attempt) -> None:
        """A first decision is sampled as it is made (a fallback or a hotspot class always
        when the sampler has room); a migrating policy's is captured at once, as its
        attempt may be sent after other requests were decided."""
        decision = attempt.decision
        if attempt.reason != "first" or decision is None:
            return
        priority = is_priority(decision)
        if not self.sampler.admit(priority, time.perf_counter()):
            return
        if plan.arm.policy.migrates:
            plan.sampled = capture(decision, plan.arm.view, plan.features, priority)
        else:
            plan.capture_due = priority

    def sending(self, plan: Plan, attempt: Attempt) -> None:
        if plan.capture_due is not None:
            plan.sampled = capture(plan.decision, plan.arm.view, plan.features, plan.capture_due)
            plan.capture_due = None

    def closed(self, plan: Plan, outcome: Outcome) -> None:
        self.recent.append((plan, outcome.status, outcome.ttft))
        sampled = plan.sampled
        if sampled is None:
            troubled = plan.attempt_count > 1 or outcome.status >= 500
            if not troubled or not self.sampler.admit(True, time.perf_counter()):
                return
            sampled = CapturedDecision(priority=True, indicators=None)
        self.telemetry.decision(self.record(plan, sampled, outcome.status, outcome.ttft))

    def record(
        self, plan: Plan, sampled: CapturedDecision, status: int, ttft: float | None
    ) -> DecisionRecord:
        decision, arm = plan.decision, plan.arm
        candidates, total = candidate_rows(
            decision, arm.instances, sampled.indicators, chosen=plan.instance
        )
        canary = plan.runtime.config.canary
        hot_class = decision.details.get("hot_class")
        transitions = [e for e in decision.events if isinstance(e, HotspotTransition)]
        if hot_class is None and transitions:
            hot_class = transitions[0].class_id
        return DecisionRecord(
            cluster=self.telemetry.cluster,
            router=self.router,
            request_id=plan.request_id,
            at=plan.features.arrival_time,
            arm=arm.name,
            canary=canary.id if canary is not None else None,
            policy=arm.policy_kind,
            instance=plan.instance,
            reason=decision.reason,
            attempts=plan.attempt_count,
            tried=list(plan.tried),
            status=status,
            ttft_s=ttft,
            prompt_tokens=plan.features.prompt_tokens,
            cached_tokens=decision.cached_tokens,
            hot_class=hot_class,
            hotspot_transitions=[e.kind for e in transitions],
            priority=sampled.priority,
            details=scalar_details(decision.details),
            candidates=candidates,
            candidates_total=total,
        )

    def last(self, count: int) -> list[dict[str, Any]]:
        """The last ``count`` closed requests' routing decisions, oldest first."""
        recent = list(self.recent)[-count:] if count > 0 else []
        return [
            {
                "request_id": plan.request_id,
                "arm": plan.arm.name,
                "policy": plan.arm.policy_kind,
                "instance": plan.instance,
                "reason": plan.reason,
                "status": status,
                "attempts": plan.attempt_count,
                "prompt_tokens": plan.features.prompt_tokens,
                "cached_tokens": plan.decision.cached_tokens,
                "tier": plan.tokenization,
                "ttft_s": ttft,
                "scores": plan.decision.score_table(),
                "details": scalar_details(plan.decision.details),
            }
            for plan, status, ttft in recent
        ]


class Migrations(LifecycleObserver[Plan]):
    """The attempts a migrating policy may move (policies that set ``migrates``).

    A streamed attempt that can still be taken back (no byte has reached the client) runs
    as its plan's own task (``Plan.run_movable``). Once such an attempt is sent, the policy
    is shown the requests queued on the instances its decision named
    (``choose_migrations``, as in the simulator); each one to move is taken back by its
    own plan (``Plan.take_back``). The dispatch step then closes that upstream stream
    (vLLM aborts a request whose client disconnects) and sends the request to the target
    as a new attempt. An attempt leaves the registry at its first token or its end."""

    __slots__ = ("metrics", "queued")

    def __init__(self, metrics: RouterMetrics) -> None:
        self.metrics = metrics
        self.queued: dict[str, Plan] = {}  # movable attempts without a first token

    def dispatched(self, plan: Plan, attempt: Attempt) -> None:
        if not plan.movable_now:
            return
        self.queued[plan.request_id] = plan
        arm = plan.arm
        waiting = [p for p in self.queued.values() if p.arm is arm]
        now = attempt.dispatched_at
        assert now is not None
        for move in choose_migrations(plan, waiting, self._can_take_back, arm.view, now):
            moved = self.queued.pop(move.request_id, None)
            if moved is None or not moved.take_back(move.target):
                continue
            self.metrics.child(self.metrics.migrations, move.source, move.target).inc()
            log.info(
                "request %s: migrated %s -> %s (benefit %.3f s)",
                move.request_id,
                move.source,
                move.target,
                move.benefit_s,
            )

    def _can_take_back(self, life: RequestLifecycle) -> bool:
        plan = self.queued.get(life.request_id)
        return plan is not None and plan.movable_now

    def first_token(self, plan: Plan, attempt: Attempt) -> None:
        self.queued.pop(plan.request_id, None)

    def ended(self, plan: Plan, attempt: Attempt) -> None:
        self.queued.pop(plan.request_id, None)


def hotspot_payload(event: HotspotTransition) -> dict[str, Any]:
    """A routing-core HotspotTransition in the contract's HotspotPayload shape (plus extras)."""
    transition = "cleared" if event.kind == "dismissed" else event.kind
    return {
        "transition": transition,
        "dismissed": event.kind == "dismissed",
        "prefix_class": event.class_id,
        "prefix_hash": event.class_id,
        "prefix_tokens": event.prefix_tokens,
        "x": event.x,
        "x_bar": event.x_bar,
        "m": event.m,
        "m_bar": event.m_bar,
        "window": event.window_s,
        "instances": list(event.instances),
        "time": event.time,
        "request_id": event.request_id,
    }


class Spans(LifecycleObserver[Plan]):
    """Ends each traced request's span (router_worker.tracing) with its stages' spans."""

    __slots__ = ("tracer",)

    def __init__(self, tracer: RequestTracer) -> None:
        self.tracer = tracer

    def closed(self, plan: Plan, outcome: Outcome) -> None:
        if plan.span is None:
            return
        attributes = {
            "switchyard.arm": plan.arm.name,
            "switchyard.policy": plan.arm.policy_kind,
            "switchyard.instance": plan.instance,
            "switchyard.reason": plan.reason,
            "switchyard.attempts": plan.attempt_count,
            "switchyard.tokenization": plan.tokenization,
            "http.response.status_code": outcome.status,
            "gen_ai.usage.output_tokens": outcome.output_tokens,
            "switchyard.cached_tokens": outcome.cached_tokens,
            "switchyard.ttft_s": outcome.ttft,
        }
        continued = [
            (a.instance, a.routed_at, a.ended_at or a.first_token_at or a.routed_at)
            for a in plan.attempts
            if a.reason == "continuation"
        ]
        error = outcome.status >= 500
        self.tracer.finish(plan.span, plan.clock, attributes, error, continuations=continued)
        plan.span = None


def refused(status: int) -> bool:
    """Whether a request that ended with ``status`` was refused rather than served (a
    client that left, 499, was served what it stayed for)."""
    return status >= 400 and status != 499


class FlowAccounting(LifecycleObserver[Plan]):
    """Flow control's view of a request (:mod:`router_worker.flow_gate`): its released
    tokens land in the indicators at dispatch; a first token or an end may make room for
    waiting requests; the end charges its tenant the output tokens, or gives back its
    quota charge if it was refused (an engine's 4xx, no instance, every attempt failed);
    TTFT and TPOT per tenant and class (the TTFT counts the time it waited)."""

    __slots__ = ("gate", "metrics")

    def __init__(self, gate: FlowGate, metrics: RouterMetrics) -> None:
        self.gate = gate
        self.metrics = metrics

    def dispatched(self, plan: Plan, attempt: Attempt) -> None:
        if plan.flow_tokens:
            self.gate.landed(plan.flow_tokens)
            plan.flow_tokens = 0

    def first_token(self, plan: Plan, attempt: Attempt) -> None:
        self.gate.poke()

    def closed(self, plan: Plan, outcome: Outcome) -> None:
        if plan.flow_tokens:
            self.gate.landed(plan.flow_tokens)
            plan.flow_tokens = 0
        features = plan.features
        m = self.metrics
        if outcome.ttft is not None:
            m.child(m.tenant_ttft, features.tenant, features.priority).observe(outcome.ttft)
        if outcome.tpot is not None:
            m.child(m.tenant_tpot, features.tenant, features.priority).observe(outcome.tpot)
        if plan.quota_charge is not None and refused(outcome.status):
            self.gate.refund(plan.quota_charge)  # not served: it does not count
        plan.quota_charge = None
        self.gate.served(features.tenant, outcome.output_tokens)
        self.gate.ended(
            features.tenant,
            features.priority,
            features.prompt_tokens + outcome.output_tokens,
            outcome.ttft,
            outcome.tpot,
        )
