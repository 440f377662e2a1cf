"""The router's state, free of HTTP: routing a request, applying a configuration.

``RouterCore`` owns the single :class:`ClusterState`, the current :class:`Runtime`
(one per applied configuration version), the health book and the telemetry
aggregates. The request path (:mod:`router_worker.ingress`) asks it, per request, for a
:class:`~router_worker.plan.Plan`::

    intake = take_in(raw, ...)                            # tokens → hashes (intake.py)
    plan = core.plan(runtime, intake, headers, started)  # arm → plan.route → decision

and then drives the plan (sent, first token, fail | migrated | abandon, done; see
:mod:`router_worker.plan`). The plan *is* the request's :class:`RequestLifecycle`
(attempts, indicator accounting, policy feedback, the retry rule: shared with the
simulator); what only the live router does per request (peers, metrics, the circuit
breaker, telemetry, decision and traffic capture, the migration registry) are the
observers the core attaches to every plan (:mod:`router_worker.observers`). The request
path tells the core of requests refused before they have a plan (:meth:`refused`) and of
those it holds (:meth:`holding`), and never reaches into its metrics or health book.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine_interface import load_cv
from router_worker import tracing
from router_worker.contract.config import RouterConfig, RouterSettings
from router_worker.decisions import DecisionSampler
from router_worker.errors import APIError
from router_worker.flow_gate import FlowGate, RequestClass
from router_worker.health import HEALTH_OF, HealthBook
from router_worker.hit_audit import HitAudit
from router_worker.intake import Intake
from router_worker.metrics import RouterMetrics
from router_worker.observers import (
    Breaker,
    DecisionLog,
    FailureLog,
    FlowAccounting,
    Hotspots,
    LoadPeaks,
    Migrations,
    RequestMetrics,
    RequestSamples,
    Spans,
    SplitCounts,
    hotspot_payload,
)
from router_worker.peers import PeerSync
from router_worker.plan import Plan
from router_worker.routing import (
    ClusterState,
    LifecycleObservers,
    NoEligibleInstanceError,
    RequestFeatures,
    session_key_from_request,
)
from router_worker.routing.disagg import decide_split
from router_worker.routing.grey import LEVELS, GreyDetector
from router_worker.routing.peer_accounting import PeerReports
from router_worker.routing.saturation import Saturation, fleet_saturation
from router_worker.routing.sessions import ChainTurn, ResponseChains
from router_worker.runtime import Arm, ArmView, Runtime, build_runtime
from router_worker.telemetry import Telemetry
from router_worker.tokenization import Tokenizer

# A Responses answer's id in its head (vLLM's ``resp_…``; the body's or response.created's).
RESPONSE_ID = re.compile(rb'"id":"(resp_[A-Za-z0-9_-]{1,200})"')
log = logging.getLogger("router_worker")
# Bytes read per second (disaggregation's KV transfers) are averaged over this window:
# a read lands between two scrapes, and one scrape's difference would flicker.
KV_RATE_WINDOW_S = 5.0


@dataclass
class ScrapeInfo:
    hit_ratio: float | None = None
    queries: float | None = None
    hits: float | None = None
    models: tuple[str, ...] = ()
    max_model_len: int | None = None  # as the engine's /v1/models reports it
    preemptions: float | None = None  # cumulative, from the engine
    tier_hit_tokens: float | None = None  # cumulative, from the engine (None: no tier)
    tier_bytes_read: float | None = None
    # Disaggregation (None: the engine has no KV connector): reads under way, failed
    # reads since its start, and bytes read per second over the last few scrapes.
    kv_transfers_in_flight: float | None = None
    kv_failed_transfers: float | None = None
    kv_bytes_per_s: float | None = None
    kv_bytes_seen: deque[tuple[float, float]] = field(default_factory=deque)  # (t, bytes)

    def saw_kv_bytes(self, now: float, total: float | None) -> None:
        """The engine's cumulative bytes read, scraped at ``now`` (monotonic seconds):
        the rate over the last `KV_RATE_WINDOW_S` (a restart, the counter falling,
        starts it afresh)."""
        seen = self.kv_bytes_seen
        if total is None:
            seen.clear()
            self.kv_bytes_per_s = None
            return
        if seen and total < seen[-1][1]:
            seen.clear()
        seen.append((now, total))
        while len(seen) > 2 and now - seen[1][0] >= KV_RATE_WINDOW_S:
            seen.popleft()
        (t0, b0), (t1, b1) = seen[0], seen[-1]
        self.kv_bytes_per_s = (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0


class RouterCore:
    def __init__(self, name: str, telemetry: Telemetry, metrics: RouterMetrics) -> None:
        self.name = name
        self.telemetry = telemetry
        self.metrics = metrics
        self.state: ClusterState | None = None
        self.runtime: Runtime | None = None
        self.health = HealthBook(self._health_changed)
        self.scrape: dict[str, ScrapeInfo] = {}
        self._ids = itertools.count()
        self._id_prefix = f"sy-{os.getpid():x}-"
        # What the router does per request beside the lifecycle (router_worker.observers)
        self.hotspot_book = Hotspots(telemetry)
        self.peaks = LoadPeaks()
        self.splits = SplitCounts()
        self.decision_log = DecisionLog(name, telemetry, DecisionSampler())
        self.migrations = Migrations(metrics)
        self.chains = ResponseChains(RouterSettings().response_chains)
        self.hit_audit = HitAudit(metrics)
        self.flow = FlowGate(metrics, lambda: self.state, telemetry.event)
        self.observers = LifecycleObservers()
        self.peers = None  # replica sync, set by the service
        telemetry.snapshot_source = self.snapshot_source
        telemetry.peaks_source = self.take_peaks
        telemetry.max_model_len_source = self.max_model_len
        metrics.saturation_source = self.saturation

    # ----- configuration ---------------------------------------------------------------
    def apply_config(self, config: RouterConfig) -> Runtime:
        """Make ``config`` current; requests already running keep their runtime."""
        settings = config.router
        tokenizer = Tokenizer(settings.tokenizer_path, settings.chat_template)
        self.chains.capacity = settings.response_chains
        if self.state is None or self.state.block_size != config.block_size:
            self.state = ClusterState(block_size=config.block_size)
            self.peaks.peaks.clear()
        self.health.configure(
            {i.name: i.state for i in config.instances},
            settings.breaker_failures,
            settings.breaker_open_s,
        )
        for name in self.health.instances:
            self.state.add_instance(name, health=HEALTH_OF[self.health.effective(name)])
            self.scrape.setdefault(name, ScrapeInfo())
        self._apply_grey(config)
        self.runtime = build_runtime(config, self.state, tokenizer, self.runtime)
        self.flow.configure(config)
        self.telemetry.cluster = config.cluster
        self.metrics.config_version.set(config.version)
        return self.runtime

    def _apply_grey(self, config: RouterConfig) -> None:
        """Grey-failure detection as configured (kept across versions with the same
        settings: what it learned of each instance stays), and the operator's overrides."""
        state, params = self.state, config.router.grey
        assert state is not None
        overridden = any(instance.grey_override != "auto" for instance in config.instances)
        if not (params.enabled or overridden):
            state.grey = None  # nothing to judge, nothing forced: no cost per request
            return
        grey = state.grey
        if grey is None or grey.params != params or grey.judging != params.enabled:
            grey = state.grey = GreyDetector(params, judging=params.enabled)
        now = time.time()
        for instance in config.instances:
            grey.override(instance.name, instance.grey_override, now)

    def grey_tick(self) -> None:
        """Report grey-failure changes that move traffic (an event each: audit, alerts)
        and refresh the gauges (the monitor's scrape loop calls it)."""
        state = self.state
        grey = None if state is None else state.grey
        if grey is None or state is None:
            return
        grey.advance(time.time())
        for change in grey.take_transitions():
            if not change.routing:  # healthy <-> suspect: nothing changed for the traffic
                log.info(
                    "instance %s: grey %s -> %s (%s)",
                    change.instance,
                    change.before.value,
                    change.after.value,
                    change.cause,
                )
                continue
            log.warning(
                "instance %s: grey %s -> %s (%s, %.2fx its normal)",
                change.instance,
                change.before.value,
                change.after.value,
                change.cause,
                change.excess,
            )
            self.telemetry.event(
                "grey",
                instance=change.instance,
                before=change.before.value,
                after=change.after.value,
                excess=round(change.excess, 3),
                cause=change.cause,
            )
        for name in state.ids:
            metrics = self.metrics
            metrics.child(metrics.grey_level, name).set(LEVELS[grey.state_of(name)])
            metrics.child(metrics.grey_excess, name).set(grey.excess_of(name))

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
    @property
    def sampler(self) -> DecisionSampler:
        """Which decisions are shipped to the live view (the decision log's)."""
        return self.decision_log.sampler

    @sampler.setter
    def sampler(self, sampler: DecisionSampler) -> None:
        self.decision_log.sampler = sampler

    @property
    def peers(self) -> PeerSync | None:
        """Replica sync, set by the service: this router's requests are reported to it."""
        return self._peers

    @peers.setter
    def peers(self, sync: PeerSync | None) -> None:
        self._peers = sync
        reports = () if sync is None else (PeerReports(sync),)
        spans = () if tracing.TRACER is None else (Spans(tracing.TRACER),)
        self.observers = LifecycleObservers(
            self.hotspot_book,
            *reports,
            Breaker(self.health),
            FailureLog(self.metrics, self.telemetry),
            RequestMetrics(self.metrics),
            self.peaks,
            self.splits,
            RequestSamples(self.telemetry),
            self.decision_log,
            self.migrations,
            self.hit_audit,
            FlowAccounting(self.flow, self.metrics),
            *spans,
        )

    def plan(
        self,
        runtime: Runtime,
        intake: Intake,
        headers: dict[str, str],
        started: float,
        request_class: RequestClass | None = None,
        flow_tokens: int = 0,
    ) -> Plan:
        """Route a request taken in by :mod:`router_worker.intake` (tokens and hashes
        are already computed there, possibly in another process) and let through by flow
        control as ``request_class`` (``flow_tokens``: its prompt tokens if flow control
        released it from a queue)."""
        if request_class is None:
            request_class = RequestClass()
        self.check_model(intake)
        t2 = time.perf_counter()
        parent, root = self._chain(intake)
        sources = runtime.config.session_sources
        session = session_key_from_request(headers, {"user": intake.user}, sources, root)
        now = time.time()
        features = RequestFeatures(
            request_id=self._id_prefix + str(next(self._ids)),
            # a chained turn: its history's blocks lead its prompt (the engine renders it)
            prompt_tokens=intake.prompt_tokens + (parent.prompt_tokens if parent else 0),
            block_hashes=parent.block_hashes if parent else intake.block_hashes,
            block_size=runtime.config.block_size,
            session_key=session,
            turn_index=_turn_index(intake, parent),
            arrival_time=now,
            tenant=request_class.tenant,
            priority=request_class.priority,
            slo_ttft_s=request_class.slo_ttft_s,
            slo_tpot_s=request_class.slo_tpot_s,
        )
        arm = _chain_arm(runtime, parent) or runtime.arm_for(session)
        assert self.state is not None
        plan = Plan(
            features=features,
            policy=arm.policy,
            state=self.state,
            max_attempts=runtime.config.router.max_attempts,
            max_continuations=runtime.config.router.max_continuations,
            observers=self.observers,
            runtime=runtime,
            arm=arm,
            tokenization=intake.tokenization,
            stream=intake.stream,
            started=started,
            flow_tokens=flow_tokens,
        )
        try:
            self._route(plan, runtime, now, _chain_view(self.state, arm, parent))
        except NoEligibleInstanceError as error:
            raise APIError(503, f"No healthy instance available: {error}") from None
        plan.timings = (intake.tokenize_s, intake.hash_s, time.perf_counter() - t2)
        return plan

    def _chain(self, intake: Intake) -> tuple[ChainTurn | None, str | None]:
        """The Responses answer a request extends (None if unknown here) and its chain's
        first response id (the previous one itself when the router has not seen it)."""
        previous = intake.previous_response_id
        if previous is None:
            return None, None
        parent = self.chains.get(previous)
        return parent, parent.root if parent else previous

    def chain_learner(self, plan: Plan, intake: Intake) -> Callable[[bytes], None]:
        """What learns a Responses answer's id from its head, filing it as its chain's
        next turn (the relay calls it; vLLM's answer leads with the id)."""
        parent, root = self._chain(intake)
        turn = _turn_index(intake, parent) or 0
        features = plan.features

        def learn(head: bytes) -> None:
            found = RESPONSE_ID.search(head)
            if found is None:
                return
            response_id = found.group(1).decode("ascii")
            self.chains.put(
                response_id,
                ChainTurn(
                    root or response_id,
                    turn,
                    features.block_hashes,
                    features.prompt_tokens,
                    plan.arm.name,
                    plan.instance,
                ),
            )

        return learn

    def check_model(self, intake: Intake) -> None:
        """APIError 404 when the request names a model the cluster does not serve."""
        models = self.allowed_models()
        if models is not None and intake.model not in models:
            raise APIError(404, f"The model `{intake.model}` does not exist.", "model")

    @staticmethod
    def _route(plan: Plan, runtime: Runtime, now: float, view: ArmView) -> None:
        """The first attempt: on a disaggregated cluster the decider splits the request
        (prefill pool first) or keeps it colocated (decode pool). ``view`` is the arm's,
        or a chained Responses turn's pinned one, which is never split (its history is
        on that instance)."""
        stages = plan.arm.stages
        if stages is None or view is not plan.arm.view:
            plan.route(view, now)
            return
        split = decide_split(
            runtime.config.stages.decider,
            plan.features,
            stages.prefill_view,
            stages.decode_view,
        )
        plan.split = split
        plan.stage = "prefill" if split.split else "whole"
        if not split.split and not stages.decode_view.eligible.any():
            plan.stage = "fallback"  # no decode pool left: colocated wherever it can run
        if split.split:
            plan.max_attempts += 1  # the decode attempt is not a retry
        plan.route(plan.stage_view, now)

    # ----- what the request path reports before a request has a plan ------------------
    def refused(self, status: int) -> None:
        """A request refused before it was routed (key, size, admission, bad body)."""
        self.metrics.child(self.metrics.rejected, str(status)).inc()

    def left_unread(self) -> None:
        """A client went away before its request's body was read whole."""
        self.metrics.bodies_unread.inc()

    def holding(self, delta: int) -> None:
        """The request path took a request in (+1) or let it go (-1)."""
        self.metrics.in_flight_count += delta

    def recent_decisions(self, count: int) -> list[dict[str, Any]]:
        """The last ``count`` finished requests' routing decisions, oldest first."""
        return self.decision_log.last(count)

    # ----- telemetry sources ------------------------------------------------------------
    def take_peaks(self) -> dict[str, tuple[float, float, float]]:
        return {} if self.state is None else self.peaks.take(self.state)

    def saturation(self) -> Saturation:
        """The fleet's saturation as this router sees it (the autoscaling signal)."""
        if self.state is None:
            return Saturation(0, 0.0, 0.0)
        return fleet_saturation(self.state.view())

    def snapshot_source(self) -> dict[str, Any]:
        from router_worker.contract.telemetry import HotspotPayload, InstanceSnapshot

        runtime, state = self.runtime, self.state
        if runtime is None or state is None:
            return {}
        arm_of = runtime.arm_of_instance()
        roles = {i.name: i.role for i in runtime.config.instances}
        hotspots = self.hotspot_book.active
        hot = {name for event in hotspots.values() for name in event.instances}
        instances = []
        # The batch size published is the one policies use: the engine's running batch
        # (prefilling and decoding requests of ours, plus other senders' load).
        batch = state.view().batch_size
        for slot, name in enumerate(state.ids):
            if name not in self.health.instances or name not in runtime.urls:
                continue
            snap = state.snapshot(name)
            scraped = self.scrape.get(name, ScrapeInfo())
            peak = self.peaks.peaks.get(slot, (0.0, 0.0))
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
                    preemptions=scraped.preemptions,
                    silent_fallback=self.hit_audit.verdict(name),
                    tier_hit_tokens=scraped.tier_hit_tokens,
                    tier_bytes_read=scraped.tier_bytes_read,
                    hotspot=name in hot,
                    arm=arm_of.get(name),
                    grey_level=None if state.grey is None else LEVELS[state.grey.state_of(name)],
                    grey_excess=None if state.grey is None else state.grey.excess_of(name),
                    role=roles.get(name),
                    kv_transfers_in_flight=scraped.kv_transfers_in_flight,
                    kv_bytes_per_s=scraped.kv_bytes_per_s,
                    kv_failed_transfers=scraped.kv_failed_transfers,
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
            "hotspots": [HotspotPayload(**hotspot_payload(e)) for e in hotspots.values()],
            "tenants": self.flow.lanes(),
            "disaggregation": self.splits.stats() if runtime.config.disaggregated else None,
        }


def _int_or_none(value: float | None) -> int | None:
    return None if value is None else int(value)


def _turn_index(intake: Intake, parent: ChainTurn | None) -> int | None:
    """A chained Responses turn follows its parent (a later turn than any unknown one)."""
    if parent is not None:
        return parent.turn + 1
    if intake.previous_response_id is not None:
        return max(1, intake.turn_index or 0)
    return intake.turn_index


def _chain_arm(runtime: Runtime, parent: ChainTurn | None) -> Arm | None:
    """The arm that served a chained turn's parent, while the configuration still has it:
    a chain's first turn has no session to pick its arm by, and its next turns must reach
    the instances holding its history (vLLM's response store is per instance)."""
    if parent is None:
        return None
    return next((arm for arm in runtime.arms if arm.name == parent.arm), None)


def _chain_view(state: ClusterState, arm: Arm, parent: ChainTurn | None) -> ArmView:
    """The arm's view, narrowed for a chained Responses turn to the instance that answered
    its parent while that one is eligible: vLLM's response store is per instance, another
    would answer 404 whatever the policy prefers. Otherwise the arm's whole view (the
    engine then says whether it holds the chain)."""
    if parent is None or parent.instance not in arm.instances:
        return arm.view
    members = np.zeros(len(state.ids), dtype=bool)
    members[state.slot_of(parent.instance)] = True
    pinned = ArmView(state, members)
    return pinned if pinned.eligible.any() else arm.view
