"""The router's state and per-request logic, free of HTTP: plan, account, apply config.

``RouterCore`` owns the single :class:`ClusterState`, the current :class:`Runtime`
(one per applied configuration version), the health book and the telemetry
aggregates. The ASGI layer (:mod:`router_worker.proxy`) calls, per request::

    intake = take_in(raw, ...)                            # tokens → hashes (intake.py)
    plan = core.plan(runtime, intake, headers, started)  # arm → lifecycle.route → decision
    core.begin_attempt(plan)                              # the attempt's instance, reason
    core.account_dispatch(plan)                           # lifecycle.dispatch (once sent)
    core.first_token(plan)                                # lifecycle.first_token
    core.finish_request(plan, ...)                        # lifecycle.finish | reject, metrics
    core.fail_attempt(plan, kind) -> RetryVerdict         # lifecycle.fail: the retry rule
    core.abandon(plan) / core.migrated(plan)              # client gone / moved

The attempts, their indicator accounting, the policy feedback and the retry rule are the
plan's :class:`RequestLifecycle` (shared with the simulator); the core adds what only the
live router has: metrics, peer sync, the migration registry and telemetry.

Migration (policies that set ``migrates``): a streamed attempt the proxy can still take
back (no byte has reached the client) carries a ``mover``; after each dispatch the core
asks the policy about the requests queued on the instances the decision named and calls
the mover of each one to move, with ``plan.migrate_to`` set. The proxy then closes that
upstream stream (vLLM aborts a request whose client disconnects) and sends the request to
the target as a new attempt.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine_interface import load_cv
from router_worker.config import RouterConfig
from router_worker.decisions import (
    CapturedDecision,
    DecisionSampler,
    candidate_rows,
    capture,
    is_priority,
    scalar_details,
)
from router_worker.errors import APIError
from router_worker.health import HEALTH_OF, HealthBook
from router_worker.intake import Intake
from router_worker.metrics import RouterMetrics
from router_worker.peers import PeerSync
from router_worker.routing import (
    ClusterState,
    Decision,
    HotspotEvent,
    NoEligibleInstanceError,
    RequestFeatures,
    RequestLifecycle,
    RetryVerdict,
    choose_migrations,
    session_key_from_request,
)
from router_worker.routing.lifecycle import Phase, engine_refused
from router_worker.runtime import Arm, Runtime, build_runtime
from router_worker.stages import StageClock
from router_worker.telemetry import RequestSample, Telemetry
from router_worker.telemetry_contract import DecisionRecord
from router_worker.tokenization import Tokenizer

log = logging.getLogger("router_worker")
RECENT_DECISIONS = 200


@dataclass(slots=True)
class Plan:
    """A routed request: its lifecycle (attempts, accounting, retry rule), its arm, the
    decision of the current attempt, and what the HTTP side needs."""

    request_id: str
    runtime: Runtime
    arm: Arm
    life: RequestLifecycle
    decision: Decision  # the last one the policy made (the first, or a retry's)
    tier: str
    started: float  # perf_counter at arrival
    sent_at: float = 0.0  # perf_counter when the last attempt's request went upstream
    instance: str = ""
    reason: str = ""
    first_token_at: float | None = None  # perf_counter at the first token (TTFT, TPOT)
    timings: tuple[float, float, float] = (0.0, 0.0, 0.0)  # tokenize, hash, decide (s)
    sampled: CapturedDecision | None = None  # kept for the live view's decision stream
    # Admitted by the sampler at decision time; captured once the request is on its way
    # (account_dispatch), from the same indicators: nothing runs in between (a migrating
    # policy's decisions are captured at once).
    capture_due: bool | None = None  # None: not admitted; else whether it is a priority
    clock: StageClock | None = None  # the per-stage stamps (router_worker.stages)
    # Migration (see the module docstring): set by the proxy while the attempt can be
    # taken back; the core sets migrate_to and calls it.
    mover: Callable[[], Any] | None = None
    migrate_to: str | None = None

    @property
    def features(self) -> RequestFeatures:
        return self.life.features

    @property
    def attempts(self) -> int:
        """Attempts made, migrations included (the lifecycle's ``attempt_count``)."""
        return self.life.attempt_count

    @property
    def tried(self) -> list[str]:
        """Instances that failed this request."""
        return self.life.failed_instances


@dataclass
class ScrapeInfo:
    hit_ratio: float | None = None
    queries: float | None = None
    hits: float | None = None
    models: tuple[str, ...] = ()
    max_model_len: int | None = None  # as the engine's /v1/models reports it
    tier_hit_tokens: float | None = None  # cumulative, from the engine (None: no tier)
    tier_bytes_read: float | None = None


class RouterCore:
    def __init__(self, name: str, telemetry: Telemetry, metrics: RouterMetrics) -> None:
        self.name = name
        self.telemetry = telemetry
        self.metrics = metrics
        self.state: ClusterState | None = None
        self.runtime: Runtime | None = None
        self.health = HealthBook(self._health_changed)
        self.scrape: dict[str, ScrapeInfo] = {}
        self.decisions: deque[tuple[Plan, int, float | None]] = deque(maxlen=RECENT_DECISIONS)
        self.hotspots: dict[str, HotspotEvent] = {}
        self._ids = itertools.count()
        self._id_prefix = f"sy-{os.getpid():x}-"
        self._peaks: dict[int, list[float]] = {}
        self.sampler = DecisionSampler()
        self.peers: PeerSync | None = None  # replica sync, set by the service
        self._queued: dict[str, Plan] = {}  # movable attempts without a first token
        telemetry.snapshot_source = self.snapshot_source
        telemetry.peaks_source = self.take_peaks
        telemetry.max_model_len_source = self.max_model_len

    # ----- configuration ---------------------------------------------------------------
    def apply_config(self, config: RouterConfig) -> Runtime:
        """Make ``config`` current; requests already running keep their runtime."""
        settings = config.router
        tokenizer = Tokenizer(settings.tokenizer_path, settings.chat_template)
        if self.state is None or self.state.block_size != config.block_size:
            self.state = ClusterState(block_size=config.block_size)
            self._peaks.clear()
        self.health.configure(
            {i.name: i.state for i in config.instances},
            settings.breaker_failures,
            settings.breaker_open_s,
        )
        for name in self.health.instances:
            self.state.add_instance(name, health=HEALTH_OF[self.health.effective(name)])
            self.scrape.setdefault(name, ScrapeInfo())
        self.runtime = build_runtime(config, self.state, tokenizer, self.runtime)
        self.telemetry.cluster = config.cluster
        self.metrics.config_version.set(config.version)
        return self.runtime

    def _health_changed(self, instance: str, before: str, after: str, cause: str) -> None:
        if self.state is not None and instance in self.state.ids:
            self.state.set_health(instance, HEALTH_OF[after])
        log.info("instance %s: %s -> %s (%s)", instance, before, after, cause)
        self.telemetry.event("health", instance=instance, before=before, after=after, cause=cause)

    def allowed_models(self) -> set[str] | None:
        """Model names requests may name; None when unknown (anything is forwarded)."""
        runtime = self.runtime
        if runtime is not None and runtime.config.model:
            return {runtime.config.model}
        learned = {m for info in self.scrape.values() for m in info.models}
        return learned or None

    def max_model_len(self) -> int | None:
        """The smallest context any instance reports: what every instance can serve."""
        lengths = [info.max_model_len for info in self.scrape.values() if info.max_model_len]
        return min(lengths) if lengths else None

    # ----- per request -------------------------------------------------------------------
    def plan(
        self, runtime: Runtime, intake: Intake, headers: dict[str, str], started: float
    ) -> Plan:
        """Route a request taken in by :mod:`router_worker.intake` (tokens and hashes
        are already computed there, possibly in another process)."""
        t2 = time.perf_counter()
        session = session_key_from_request(headers, {"user": intake.user})
        request_id = self._id_prefix + str(next(self._ids))
        now = time.time()
        features = RequestFeatures(
            request_id=request_id,
            prompt_tokens=intake.prompt_tokens,
            block_hashes=intake.block_hashes,
            block_size=runtime.config.block_size,
            session_key=session,
            turn_index=intake.turn_index,
            arrival_time=now,
        )
        arm = runtime.arm_for(session)
        assert self.state is not None
        life = RequestLifecycle(
            features, arm.policy, self.state, max_attempts=runtime.config.router.max_attempts
        )
        try:
            decision = life.route(arm.view, now).decision
        except NoEligibleInstanceError as error:
            raise APIError(503, f"No healthy instance available: {error}") from None
        assert decision is not None
        t3 = time.perf_counter()
        if decision.events:
            self._hotspot_events(decision.events)
        priority = is_priority(decision)
        due = priority if self.sampler.admit(priority, t3) else None
        sampled = None
        if due is not None and arm.policy.migrates:
            # Its attempt may run as a task of its own (proxy._movable_attempt), sent after
            # other requests were decided: capture now.
            sampled, due = capture(decision, arm.view, features, due), None
        return Plan(
            request_id,
            runtime,
            arm,
            life,
            decision,
            intake.tier,
            started,
            instance=decision.instance_id,
            reason=decision.reason,
            timings=(intake.tokenize_s, intake.hash_s, t3 - t2),
            sampled=sampled,
            capture_due=due,
        )

    def begin_attempt(self, plan: Plan) -> None:
        """The lifecycle's current (routed) attempt is about to be sent."""
        attempt = plan.life.current
        plan.instance = attempt.instance
        if attempt.reason != "first":
            plan.reason = attempt.reason

    def account_dispatch(self, plan: Plan) -> None:
        """Indicators of the attempt just sent, and the plan's hot-path metrics.

        Called once the request is on its way upstream, before any other request is
        decided (the transport's ``on_sent``): the accounting no longer delays the
        request's arrival at the engine, and no decision misses it. A decision the sampler
        admitted is captured here, before the dispatch is accounted: the indicators are
        still those it was made from (no await since), and the copy is off the request's
        way to the engine."""
        state = plan.life.state
        if plan.capture_due is not None:
            plan.sampled = capture(plan.decision, plan.arm.view, plan.features, plan.capture_due)
            plan.capture_due = None
        now = time.time()
        plan.life.dispatch(now)
        if self.peers is not None:
            decision = plan.life.current.decision
            self.peers.dispatched(
                plan.request_id,
                plan.instance,
                plan.features,
                None if decision is None else decision.cached_tokens,
            )
        if plan.attempts == 1:
            self._observe_plan(plan)
        slot = state.slot_of(plan.instance)
        peak = self._peaks.setdefault(slot, [0.0, 0.0])
        peak[0] = max(peak[0], float(state.pending[slot]))
        # The batch (as policies see it) grows at dispatch: in-flight is its upper bound.
        peak[1] = max(peak[1], float(state.in_flight[slot]))
        if plan.mover is not None:
            self._queued[plan.request_id] = plan
            self._migrate_around(plan, now)

    def _migrate_around(self, plan: Plan, now: float) -> None:
        """Ask the policy to move requests queued on the instances ``plan``'s decision
        named; signal each one to move (its proxy task re-sends it)."""
        arm = plan.arm
        waiting = [p.life for p in self._queued.values() if p.arm is arm]
        for move in choose_migrations(plan.life, waiting, self._movable, arm.view, now):
            moved = self._queued.pop(move.request_id, None)
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

    def _movable(self, life: RequestLifecycle) -> bool:
        plan = self._queued.get(life.request_id)
        return plan is not None and plan.mover is not None

    def _observe_plan(self, plan: Plan) -> None:
        metrics = self.metrics
        tokenize, hashing, decide = plan.timings
        metrics.child(metrics.tokenize_seconds, plan.tier).observe(tokenize)
        metrics.hashing_seconds.observe(hashing)
        metrics.child(metrics.decision_seconds, plan.arm.policy_kind).observe(decide)
        metrics.child(metrics.tier, plan.tier).inc()

    def first_token(self, plan: Plan) -> None:
        now = time.time()
        self._queued.pop(plan.request_id, None)
        plan.first_token_at = time.perf_counter()
        if (
            plan.life.first_token(now, plan.first_token_at - plan.started)
            and self.peers is not None
        ):
            self.peers.first_token(plan.request_id)

    def fail_attempt(
        self, plan: Plan, kind: str, *, final: bool = False, first_byte: bool = False
    ) -> RetryVerdict:
        """The current attempt failed: the lifecycle's retry rule says whether (and where,
        by deciding again without the instances that failed) the request is tried again."""
        self._queued.pop(plan.request_id, None)
        dispatched = plan.life.current.phase is not Phase.ROUTED
        verdict = plan.life.fail(
            plan.arm.view, time.time(), kind, final=final, first_byte=first_byte
        )
        if dispatched and self.peers is not None:
            self.peers.ended(plan.request_id, False)
        if verdict.attempt is not None and verdict.attempt.decision is not None:
            plan.decision = verdict.attempt.decision
            if plan.decision.events:
                self._hotspot_events(plan.decision.events)
        return verdict

    def abandon(self, plan: Plan) -> None:
        """The client went away (or the task was stopped): the open attempt is given up."""
        self._queued.pop(plan.request_id, None)
        attempt = plan.life.current
        if not attempt.open:
            return
        dispatched = attempt.phase is not Phase.ROUTED
        plan.life.abandon(time.time())
        if dispatched and self.peers is not None:
            self.peers.ended(plan.request_id, False)

    def migrated(self, plan: Plan) -> None:
        """The attempt was taken back (``plan.migrate_to`` set by the migration): open the
        next one on the target."""
        target, plan.migrate_to = plan.migrate_to, None
        assert target is not None
        plan.life.migrate(target, time.time())
        if self.peers is not None:
            self.peers.ended(plan.request_id, True)

    def _finish_attempt(self, plan: Plan, status: int, ok: bool, output_tokens: int) -> None:
        self._queued.pop(plan.request_id, None)
        life = plan.life
        attempt = life.current
        if attempt.phase not in (Phase.DISPATCHED, Phase.FIRST_TOKEN):
            return  # already ended (failed mid-stream, abandoned) or never sent
        now = time.time()
        # An open attempt's status is the engine's answer: a 4xx refused the request
        # before any token, the simulator's EngineRequestError (lifecycle.reject there too).
        refused = engine_refused(status) and attempt.phase is Phase.DISPATCHED
        if refused:
            life.reject(now)
        else:
            life.finish(now, output_tokens, ok=ok and bool(plan.instance))
        if self.peers is not None:
            self.peers.ended(plan.request_id, not refused)

    def finish_request(
        self,
        plan: Plan,
        *,
        status: int,
        ok: bool,
        output_tokens: int,
        last_token_at: float | None,
        cached_tokens: int | None,
    ) -> None:
        """Metrics and telemetry of a request that got an answer (or gave up), and the end
        of its attempt if still open: ``status`` is then the engine's answer, and a 4xx
        (the engine refused the request) rejects the attempt rather than finishing it.
        Either way a 4xx counts as a request served, not a serving error (the client's
        bad request): ``requests_total{status}`` and the telemetry sample say so."""
        metrics = self.metrics
        arm = plan.arm
        ttft = tpot = None
        if plan.first_token_at is not None:
            ttft = plan.first_token_at - plan.started
            metrics.child(metrics.ttft, arm.name).observe(ttft)
            if last_token_at is not None and output_tokens > 1:
                # Tokens read in the same chunk as the first one are stamped before it is
                # relayed: clamp, or a one-chunk answer has a negative TPOT.
                tpot = max(0.0, last_token_at - plan.first_token_at) / (output_tokens - 1)
                metrics.child(metrics.tpot, arm.name).observe(tpot)
        metrics.child(metrics.requests, arm.policy_kind, arm.name, plan.reason, str(status)).inc()
        self._finish_attempt(plan, status, ok, output_tokens)
        self.telemetry.record(
            RequestSample(
                at=time.time(),
                arm=arm.name,
                policy=arm.policy_kind,
                instance=plan.instance or None,
                ok=ok or status < 500,
                ttft=ttft,
                tpot=tpot,
                output_tokens=output_tokens,
                prompt_tokens=plan.features.prompt_tokens,
                cached_tokens=plan.decision.cached_tokens
                if cached_tokens is None
                else cached_tokens,
                fallback=plan.decision.reason == "hotspot_fallback",
            )
        )
        capture = plan.runtime.config.capture
        if capture is not None:
            self.telemetry.capture.add(
                capture,
                plan.features,
                output_tokens=output_tokens,
                instance=plan.instance,
                arm=arm.name,
                status=status,
                ttft_s=ttft,
                tpot_s=tpot,
            )
        # The dict (with its per-candidate score table) is built only when /admin/state
        # asks: most requests' entries leave the deque unread.
        self.decisions.append((plan, status, ttft))
        self._publish_decision(plan, status, ttft)

    def _publish_decision(self, plan: Plan, status: int, ttft: float | None) -> None:
        """Ship the plan's decision to the live view if it was sampled, or if it was retried
        or failed on the serving side (admitted now, without the indicators of decision
        time)."""
        sampled = plan.sampled
        if sampled is None:
            troubled = plan.attempts > 1 or status >= 500
            if not troubled or not self.sampler.admit(True, time.perf_counter()):
                return
            sampled = CapturedDecision(priority=True, indicators=None)
        self.telemetry.decision(self.decision_record(plan, sampled, status, ttft))

    def decision_record(
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
            router=self.name,
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

    def recent_decisions(self, count: int) -> list[dict[str, Any]]:
        """The last ``count`` finished requests' routing decisions, oldest first."""
        recent = list(self.decisions)[-count:] if count > 0 else []
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
                "tier": plan.tier,
                "ttft_s": ttft,
                "scores": plan.decision.score_table(),
                "details": scalar_details(plan.decision.details),
            }
            for plan, status, ttft in recent
        ]

    def _hotspot_events(self, events: tuple[Any, ...]) -> None:
        for event in events:
            if not isinstance(event, HotspotEvent):
                continue
            payload = hotspot_payload(event)
            if event.kind == "confirmed":
                self.hotspots[event.class_id] = event
            elif event.kind in ("cleared", "dismissed"):
                self.hotspots.pop(event.class_id, None)
            self.telemetry.event("hotspot", **payload)

    # ----- telemetry sources ------------------------------------------------------------
    def take_peaks(self) -> dict[str, tuple[float, float, float]]:
        state = self.state
        if state is None:
            return {}
        peaks = {}
        batch_now = state.view().batch_size
        for slot, name in enumerate(state.ids):
            pending, batch = self._peaks.get(slot, (0.0, 0.0))
            kv = float(np.nan_to_num(state.kv_usage[slot]))
            peaks[name] = (
                max(pending, float(state.pending[slot])),
                max(batch, float(batch_now[slot])),
                kv,
            )
        self._peaks.clear()
        return peaks

    def snapshot_source(self) -> dict[str, Any]:
        from router_worker.telemetry_contract import HotspotPayload, InstanceSnapshot

        runtime, state = self.runtime, self.state
        if runtime is None or state is None:
            return {}
        arm_of = runtime.arm_of_instance()
        hot = {name for event in self.hotspots.values() for name in event.instances}
        instances = []
        # The batch size published is the one policies use: the engine's running batch
        # (prefilling and decoding requests of ours, plus other senders' load).
        batch = state.view().batch_size
        for slot, name in enumerate(state.ids):
            if name not in self.health.instances or name not in runtime.urls:
                continue
            snap = state.snapshot(name)
            scraped = self.scrape.get(name, ScrapeInfo())
            peak = self._peaks.get(slot, (0.0, 0.0))
            batch_now = float(batch[slot])
            instances.append(
                InstanceSnapshot(
                    name=name,
                    health=self.health.effective(name),
                    pending_prefill_tokens=snap.pending_prefill_tokens,
                    pending_prefill_tokens_max=max(peak[0], snap.pending_prefill_tokens),
                    batch_size=batch_now,
                    batch_size_max=max(peak[1], batch_now),
                    in_flight=int(snap.in_flight),
                    waiting=_int_or_none(snap.scraped_waiting),
                    running=_int_or_none(snap.scraped_running),
                    kv_usage=snap.kv_usage,
                    hit_ratio=scraped.hit_ratio,
                    tier_hit_tokens=scraped.tier_hit_tokens,
                    tier_bytes_read=scraped.tier_bytes_read,
                    hotspot=name in hot,
                    arm=arm_of.get(name),
                )
            )
        cv = load_cv([i.pending_prefill_tokens for i in instances if i.health == "healthy"])
        policy = "+".join(arm.policy_kind for arm in runtime.arms)
        return {
            "config_version": runtime.version,
            "policy": policy,
            "instances": instances,
            "arms": [arm.name for arm in runtime.arms],
            "load_cv": cv,
            "hotspots": [HotspotPayload(**hotspot_payload(e)) for e in self.hotspots.values()],
        }


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


def _int_or_none(value: float | None) -> int | None:
    return None if value is None else int(value)
