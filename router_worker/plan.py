"""One routed request at the live router: its lifecycle, driven on the wall clock.

A :class:`Plan` *is* the request's :class:`RequestLifecycle` (the one the simulator drives
too), extended with what only the live router keeps: its arm and runtime, its stage clock,
its sampled decision and the handle of a movable attempt. :meth:`RouterCore.plan
<router_worker.core.RouterCore.plan>` makes and routes it; the request path
(:mod:`router_worker.dispatch`, :mod:`router_worker.relay`) drives it, each method one
lifecycle transition stamped with the wall clock::

    plan.sent()                          # the transport's on_sent: dispatch
    plan.first_token_sent()              # the first token relayed: first_token
    plan.attempt_failed(kind) -> verdict # fail: the retry rule
    plan.migrated()                      # its attempt was taken back: migrate
    plan.client_gone()                   # the client went away: abandon
    plan.done(status=..., ...)           # answer (finish | reject), then close

Everything else the router does per request (peers, metrics, the circuit breaker,
telemetry, decision and traffic capture, migration) is a ``LifecycleObserver[Plan]`` the
core attached (:mod:`router_worker.observers`): each sees the plan itself, typed. There is
no link back to break: once the request path lets go of a plan, reference counting frees
it.

Migration is a plan step too: :meth:`Plan.run_movable` runs an attempt as the plan's own
task, and :meth:`Plan.take_back` (the migration observer's call) stops it; nothing outside
the plan cancels the request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from router_worker.decisions import CapturedDecision
from router_worker.routing import ClusterView, Decision, RequestLifecycle, RetryVerdict
from router_worker.routing.disagg import SplitDecision
from router_worker.routing.quota import QuotaCharge
from router_worker.runtime import Arm, Runtime
from router_worker.stages import StageClock

T = TypeVar("T")


@dataclass(slots=True)
class Outcome:
    """How the request ended for its client (``Plan.finish``): what observers of its close
    record. A 4xx is a request served (the client's bad request), not a serving error."""

    status: int
    ok: bool
    output_tokens: int
    ttft: float | None  # s from arrival to the first token relayed
    tpot: float | None  # s per output token after the first
    cached_tokens: int  # the engine's count if it reported one, else the decision's


class TakenBack(Exception):
    """The plan's attempt was taken back to move the request (:meth:`Plan.take_back`)."""


@dataclass(slots=True, kw_only=True, weakref_slot=True)  # weakly referable: tests
class Plan(RequestLifecycle):
    """A routed request: its lifecycle (attempts, accounting, retry rule, observers), its
    arm, and what the HTTP side needs."""

    runtime: Runtime
    arm: Arm
    tokenization: str  # the tokenization mode
    stream: bool = False
    started: float  # perf_counter at arrival
    sent_at: float = 0.0  # perf_counter when the last attempt's request went upstream
    first_token_at: float | None = None  # perf_counter at the first token (TTFT, TPOT)
    timings: tuple[float, float, float] = (0.0, 0.0, 0.0)  # tokenize, hash, decide (s)
    sampled: CapturedDecision | None = None  # kept for the live view's decision stream
    # Admitted by the sampler at decision time; captured once the request is on its way
    # (the lifecycle's ``sending``), from the same indicators: nothing runs in between (a
    # migrating policy's decisions are captured at once).
    capture_due: bool | None = None  # None: not admitted; else whether it is a priority
    clock: StageClock | None = None  # the per-stage stamps (router_worker.stages)
    span: Any = None  # its OpenTelemetry span when tracing is on (router_worker.tracing)
    # Prompt tokens flow control released and the indicators do not hold yet (0 once the
    # request is dispatched: router_worker.flow_gate).
    flow_tokens: int = 0
    # What its tenant's quota was charged: given back if it is not served (FlowAccounting).
    quota_charge: QuotaCharge | None = None
    # Migration: the attempt's task while it can be taken back, and where it goes then.
    mover: asyncio.Future[Any] | None = field(default=None, repr=False)
    migrate_to: str | None = None
    # The last decision the policy made (the first, or a retry's); a plan is routed as it
    # is made (RouterCore.plan), so it always has one.
    decision: Decision = field(init=False)
    # Disaggregation: the decider's verdict (None: the cluster is not disaggregated) and
    # the stage the current attempt serves: prefill, decode, or whole (colocated).
    split: SplitDecision | None = None
    stage: str = "whole"  # prefill | decode | whole | fallback
    prefill_instance: str | None = None  # the instance whose KV the decode attempt reads

    @property
    def instance(self) -> str:
        """The current attempt's instance."""
        return self.current.instance

    @property
    def reason(self) -> str:
        """Why the current attempt went where it did: the decision's reason for the first
        try, else ``retry`` or ``migration``."""
        attempt = self.current
        return self.decision.reason if attempt.reason == "first" else attempt.reason

    @property
    def stage_view(self) -> ClusterView:
        """The view the current stage decides (and retries) over."""
        stages = self.arm.stages
        if stages is None:
            return self.arm.view
        pools = {"prefill": stages.prefill_view, "decode": stages.decode_view}
        # whole: colocated on the decode pool; fallback: wherever the arm's policy finds room
        pools["whole"] = stages.decode_view
        return pools.get(self.stage, self.arm.view)

    @property
    def tried(self) -> list[str]:
        """Instances that failed this request."""
        return self.failed_instances

    # ----- transitions (the wall clock's) ----------------------------------------------
    def sent(self) -> None:
        """The current attempt is on its way upstream (the transport's ``on_sent``, before
        any other request is decided): its accounting."""
        self.dispatch(time.time())

    def first_token_sent(self) -> None:
        """The attempt's first token is on its way to the client. A continuation's is not
        the answer's: TTFT stays the first attempt's; the policy hears the continuation's
        own time to its first token."""
        now = time.perf_counter()
        if self.first_token_at is None:
            self.first_token_at = now
            self.first_token(time.time(), now - self.started)
        else:
            self.first_token(time.time(), now - self.sent_at)

    def attempt_failed(
        self, kind: str, *, final: bool = False, first_byte: bool = False, detail: str = ""
    ) -> RetryVerdict:
        """The current attempt failed: the lifecycle's retry rule says whether (and where,
        by deciding again without the instances that failed) the request is tried again."""
        return self.fail(
            self.stage_view,
            time.time(),
            kind,
            final=final,
            first_byte=first_byte,
            detail=detail,
        )

    def prefilled(self) -> None:
        """The prefill attempt answered with its ``kv_transfer_params``: it ends (its one
        token is not the client's), and the decode attempt is routed by the decode stage's
        policy (NoEligibleInstanceError: no decode instance)."""
        now = time.time()
        self.finish(now, 1)
        self.prefill_instance = self.current.instance
        stages = self.arm.stages
        assert stages is not None, "only a disaggregated cluster prefills"
        self.stage = "decode"
        self.next_stage(stages.decode_policy, stages.decode_view, now, "decode")

    def fall_back(self) -> None:
        """Split failed (no prefill instance could serve it, or no decode could read it):
        the request runs colocated, wherever the arm's policy puts it
        (NoEligibleInstanceError: nowhere)."""
        self.stage = "fallback"
        self.next_stage(self.arm.policy, self.arm.view, time.time(), "fallback")

    def migrated(self) -> None:
        """The attempt was taken back (``migrate_to`` set by :meth:`take_back`): open the
        next one on the target."""
        target, self.migrate_to = self.migrate_to, None
        assert target is not None
        self.migrate(target, time.time())

    def client_gone(self) -> None:
        """The client went away (or the task was stopped): the open attempt is given up."""
        if self.attempts and self.current.open:
            self.abandon(time.time())

    def done(
        self,
        *,
        status: int,
        ok: bool,
        output_tokens: int,
        last_token_at: float | None,
        cached_tokens: int | None,
    ) -> None:
        """The request got an answer (or gave up): the end of its attempt if still open
        (:meth:`RequestLifecycle.answer`), then its close."""
        now = time.time()
        self.answer(now, status, output_tokens, ok=ok)
        ttft = tpot = None
        if self.first_token_at is not None:
            ttft = self.first_token_at - self.started
            if last_token_at is not None and output_tokens > 1:
                # Tokens read in the same chunk as the first one are stamped before it is
                # relayed: clamp, or a one-chunk answer has a negative TPOT.
                tpot = max(0.0, last_token_at - self.first_token_at) / (output_tokens - 1)
        cached = self.decision.cached_tokens if cached_tokens is None else cached_tokens
        self.close(now, Outcome(status, ok, output_tokens, ttft, tpot, cached))

    # ----- migration -------------------------------------------------------------------
    async def run_movable(self, attempt: Coroutine[Any, Any, T]) -> T:
        """Run ``attempt`` as this plan's own task, which :meth:`take_back` may stop until
        :meth:`settled` (its first byte): then :class:`TakenBack` is raised and
        ``migrate_to`` names the instance to send the request to."""
        task = asyncio.ensure_future(attempt)
        self.mover = task
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if self.migrate_to is None or (current is not None and current.cancelling()):
                raise  # the client went away (or the server stops): not a migration
            raise TakenBack from None
        finally:
            self.mover = None  # the task refers to this plan: no cycle left behind

    def settled(self) -> None:
        """Bytes go to the client from here on: the attempt can no longer be taken back."""
        self.mover = None

    @property
    def movable_now(self) -> bool:
        """The attempt runs as the plan's task and can still be taken back."""
        return self.mover is not None

    def take_back(self, target: str) -> bool:
        """Stop the movable attempt to send the request to ``target`` instead (the
        migration observer's step); False if it can no longer be taken back."""
        mover = self.mover
        if mover is None:
            return False
        self.mover, self.migrate_to = None, target
        mover.cancel()
        return True
