"""What the live router does per request beside the lifecycle's own accounting.

Each concern is a :class:`LifecycleObserver` that :class:`~router_worker.core.RouterCore`
attaches to every request's :class:`RequestLifecycle`; the request's
:class:`~router_worker.plan.Plan` is the lifecycle's ``context``. The lifecycle tells each
one of every transition once, so no per-request method has to remember them:

* :class:`Hotspots`: the hotspot transitions a decision raised (telemetry events, and
  the confirmed ones the snapshot shows);
* :class:`~router_worker.routing.peer_accounting.PeerReports` (shared with the simulator):
  this router's requests, told to its peers (replica sync);
* :class:`RequestMetrics`: the per-request Prometheus metrics;
* :class:`LoadPeaks`: the highest pending prefill and batch per instance between
  telemetry snapshots;
* :class:`RequestSamples`: the telemetry sample of each request, and traffic capture;
* :class:`DecisionLog`: the sampled decisions (captured from the indicators they were
  made on), shipped to the live view, and the recent ones ``/admin/state`` shows;
* :class:`Migrations`: the registry of attempts a migrating policy may move.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

import numpy as np

from router_worker.decisions import (
    CapturedDecision,
    DecisionSampler,
    candidate_rows,
    capture,
    scalar_details,
)
from router_worker.metrics import RouterMetrics
from router_worker.plan import Outcome, Plan
from router_worker.routing import (
    Attempt,
    ClusterState,
    HotspotEvent,
    LifecycleObserver,
    RequestLifecycle,
    choose_migrations,
)
from router_worker.telemetry import RequestSample, Telemetry
from router_worker.telemetry_contract import DecisionRecord

log = logging.getLogger("router_worker")
RECENT_DECISIONS = 200


class Hotspots(LifecycleObserver):
    """Hotspot transitions raised by decisions: each one a telemetry event; the confirmed
    (not yet cleared) ones are ``active``."""

    __slots__ = ("active", "telemetry")

    def __init__(self, telemetry: Telemetry) -> None:
        self.telemetry = telemetry
        self.active: dict[str, HotspotEvent] = {}

    def routed(self, life: RequestLifecycle, attempt: Attempt) -> None:
        if attempt.decision is None:
            return
        for event in attempt.decision.events:
            if not isinstance(event, HotspotEvent):
                continue
            if event.kind == "confirmed":
                self.active[event.class_id] = event
            elif event.kind in ("cleared", "dismissed"):
                self.active.pop(event.class_id, None)
            self.telemetry.event("hotspot", **hotspot_payload(event))


class RequestMetrics(LifecycleObserver):
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

    def dispatched(self, life: RequestLifecycle, attempt: Attempt) -> None:
        if life.attempt_count != 1:
            return
        plan: Plan = life.context
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

    def closed(self, life: RequestLifecycle, outcome: Outcome) -> None:
        plan: Plan = life.context
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
        if outcome.ttft is not None:
            ttft.observe(outcome.ttft)
        if outcome.tpot is not None:
            tpot.observe(outcome.tpot)
        requests.inc()


class LoadPeaks(LifecycleObserver):
    """The highest pending prefill and in-flight count of each instance (by slot) since
    the last telemetry snapshot: the batch (as policies see it) grows at dispatch, and
    in-flight is its upper bound."""

    __slots__ = ("peaks",)

    def __init__(self) -> None:
        self.peaks: dict[int, list[float]] = {}

    def dispatched(self, life: RequestLifecycle, attempt: Attempt) -> None:
        state = life.state
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


class RequestSamples(LifecycleObserver):
    """Each closed request as a telemetry sample, and as a captured request when the
    runtime's configuration captures traffic."""

    __slots__ = ("telemetry",)

    def __init__(self, telemetry: Telemetry) -> None:
        self.telemetry = telemetry

    def closed(self, life: RequestLifecycle, outcome: Outcome) -> None:
        plan: Plan = life.context
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


class DecisionLog(LifecycleObserver):
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

    def sending(self, life: RequestLifecycle, attempt: Attempt) -> None:
        plan: Plan = life.context
        if plan.capture_due is not None:
            plan.sampled = capture(plan.decision, plan.arm.view, plan.features, plan.capture_due)
            plan.capture_due = None

    def closed(self, life: RequestLifecycle, outcome: Outcome) -> None:
        plan: Plan = life.context
        self.recent.append((plan, outcome.status, outcome.ttft))
        sampled = plan.sampled
        if sampled is None:
            troubled = plan.attempts > 1 or outcome.status >= 500
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
        transitions = [e for e in decision.events if isinstance(e, HotspotEvent)]
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
            attempts=plan.attempts,
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
                "attempts": plan.attempts,
                "prompt_tokens": plan.features.prompt_tokens,
                "cached_tokens": plan.decision.cached_tokens,
                "tier": plan.tokenization,
                "ttft_s": ttft,
                "scores": plan.decision.score_table(),
                "details": scalar_details(plan.decision.details),
            }
            for plan, status, ttft in recent
        ]


class Migrations(LifecycleObserver):
    """The attempts a migrating policy may move (policies that set ``migrates``).

    A streamed attempt the proxy can still take back (no byte has reached the client)
    carries a ``mover``, which stops the proxy's task for it. Once such an attempt is
    sent, the policy is shown the requests queued on the instances its decision named
    (``choose_migrations``, as in the simulator); each one to move gets ``migrate_to`` and
    its mover is called. The proxy then closes that upstream stream (vLLM aborts a request
    whose client disconnects) and sends the request to the target as a new attempt. An
    attempt leaves the registry at its first token or its end."""

    __slots__ = ("metrics", "queued")

    def __init__(self, metrics: RouterMetrics) -> None:
        self.metrics = metrics
        self.queued: dict[str, Plan] = {}  # movable attempts without a first token

    def dispatched(self, life: RequestLifecycle, attempt: Attempt) -> None:
        plan: Plan = life.context
        if plan.mover is None:
            return
        self.queued[plan.request_id] = plan
        arm = plan.arm
        waiting = [p.life for p in self.queued.values() if p.arm is arm]
        now = attempt.dispatched_at
        assert now is not None
        for move in choose_migrations(life, waiting, self._can_take_back, arm.view, now):
            moved = self.queued.pop(move.request_id, None)
            if moved is None or moved.mover is None:
                continue
            mover, moved.mover, moved.migrate_to = moved.mover, None, move.target
            mover()
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
        return plan is not None and plan.mover is not None

    def first_token(self, life: RequestLifecycle, attempt: Attempt) -> None:
        self.queued.pop(life.request_id, None)

    def ended(self, life: RequestLifecycle, attempt: Attempt) -> None:
        self.queued.pop(life.request_id, None)


def hotspot_payload(event: HotspotEvent) -> dict[str, Any]:
    """A routing-core HotspotEvent in the contract's HotspotPayload shape (plus extras)."""
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
