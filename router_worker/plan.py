"""One routed request at the live router: its lifecycle, driven on the wall clock.

:meth:`RouterCore.plan <router_worker.core.RouterCore.plan>` makes a :class:`Plan`; the
proxy then drives it, and each of its methods is one :class:`RequestLifecycle` transition
stamped with the wall clock::

    plan.sent()                  # the transport's on_sent: lifecycle.dispatch
    plan.first_token()           # the first token relayed: lifecycle.first_token
    plan.fail(kind) -> verdict   # lifecycle.fail: the retry rule
    plan.migrated()              # taken back to move it: lifecycle.migrate
    plan.abandon()               # the client went away: lifecycle.abandon
    plan.finish(status, ...)     # lifecycle.finish | reject, then lifecycle.close

Everything else the router does per request (peers, metrics, telemetry, decision and
traffic capture, the migration registry) is a :class:`LifecycleObserver` the core
attached (:mod:`router_worker.observers`); they reach this plan as ``life.context``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from router_worker.decisions import CapturedDecision
from router_worker.routing import Decision, RequestFeatures, RequestLifecycle, RetryVerdict
from router_worker.routing.lifecycle import Phase, engine_refused
from router_worker.runtime import Arm, Runtime
from router_worker.stages import StageClock


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


@dataclass(slots=True)
class Plan:
    """A routed request: its lifecycle (attempts, accounting, retry rule, observers), its
    arm, and what the HTTP side needs."""

    request_id: str
    runtime: Runtime
    arm: Arm
    life: RequestLifecycle
    tokenization: str  # the tokenization mode
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
    # Migration: set by the proxy while the attempt can be taken back; the migration
    # registry (observers.Migrations) sets migrate_to and calls it.
    mover: Callable[[], Any] | None = None
    migrate_to: str | None = None

    @property
    def features(self) -> RequestFeatures:
        return self.life.features

    @property
    def decision(self) -> Decision:
        """The last decision the policy made (the first, or a retry's)."""
        decision = self.life.decision
        assert decision is not None  # a plan is routed
        return decision

    @property
    def instance(self) -> str:
        """The current attempt's instance."""
        return self.life.current.instance

    @property
    def reason(self) -> str:
        """Why the current attempt went where it did: the decision's reason for the first
        try, else ``retry`` or ``migration``."""
        attempt = self.life.current
        return self.decision.reason if attempt.reason == "first" else attempt.reason

    @property
    def attempts(self) -> int:
        """Attempts made, migrations included (the lifecycle's ``attempt_count``)."""
        return self.life.attempt_count

    @property
    def tried(self) -> list[str]:
        """Instances that failed this request."""
        return self.life.failed_instances

    # ----- transitions (the wall clock's) ----------------------------------------------
    def sent(self) -> None:
        """The current attempt is on its way upstream (the transport's ``on_sent``, before
        any other request is decided): its accounting."""
        self.life.dispatch(time.time())

    def first_token(self) -> None:
        """The first token is on its way to the client."""
        self.first_token_at = time.perf_counter()
        self.life.first_token(time.time(), self.first_token_at - self.started)

    def fail(self, kind: str, *, final: bool = False, first_byte: bool = False) -> RetryVerdict:
        """The current attempt failed: the lifecycle's retry rule says whether (and where,
        by deciding again without the instances that failed) the request is tried again."""
        return self.life.fail(self.arm.view, time.time(), kind, final=final, first_byte=first_byte)

    def migrated(self) -> None:
        """The attempt was taken back (``migrate_to`` set by the migration): open the next
        one on the target."""
        target, self.migrate_to = self.migrate_to, None
        assert target is not None
        self.life.migrate(target, time.time())

    def release(self) -> None:
        """The request is over: the lifecycle lets go of this plan. The two refer to each
        other, and reference counting cannot free a cycle: left to the cyclic GC, some 700
        requests' objects went at once, in a 10–20 ms pause of the event loop."""
        self.life.context = None

    def abandon(self) -> None:
        """The client went away (or the task was stopped): the open attempt is given up."""
        if self.life.current.open:
            self.life.abandon(time.time())

    def finish(
        self,
        *,
        status: int,
        ok: bool,
        output_tokens: int,
        last_token_at: float | None,
        cached_tokens: int | None,
    ) -> None:
        """The request got an answer (or gave up): the end of its attempt if still open,
        then its close. ``status`` of an open attempt is the engine's answer: a 4xx (the
        engine refused the request) rejects the attempt rather than finishing it."""
        life = self.life
        now = time.time()
        attempt = life.current
        if attempt.phase is Phase.DISPATCHED and engine_refused(status):
            life.reject(now)
        elif attempt.phase in (Phase.DISPATCHED, Phase.FIRST_TOKEN):
            life.finish(now, output_tokens, ok=ok)
        ttft = tpot = None
        if self.first_token_at is not None:
            ttft = self.first_token_at - self.started
            if last_token_at is not None and output_tokens > 1:
                # Tokens read in the same chunk as the first one are stamped before it is
                # relayed: clamp, or a one-chunk answer has a negative TPOT.
                tpot = max(0.0, last_token_at - self.first_token_at) / (output_tokens - 1)
        cached = self.decision.cached_tokens if cached_tokens is None else cached_tokens
        life.close(now, Outcome(status, ok, output_tokens, ttft, tpot, cached))
