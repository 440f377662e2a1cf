"""One request's life at the router: its attempts, their indicator accounting, the retry rule.

Pure (no I/O, no clock: every method takes ``now``), so the live router
(:mod:`router_worker.core`, :mod:`router_worker.dispatch`, :mod:`router_worker.relay`) and
the simulator (:mod:`enginesim.replay.simulator`) drive the same object and cannot drift
apart.

An attempt goes ``routed → dispatched → first_token`` and ends ``finished``, ``failed``,
``abandoned`` (the client went away), ``migrated`` (taken back to move the request) or
``rejected`` (the engine refused it outright: an answer with a 4xx status, before any
token — see :func:`engine_refused`; the simulator's engine raises ``EngineRequestError``
where vLLM answers 400). Each transition does its
:class:`ClusterState` accounting and policy feedback exactly once; a transition that makes
no sense for the attempt's phase raises :class:`IllegalTransition`. Late reports about an
attempt that has already ended (a first token still in the telemetry pipe when the instance
died) are ignored: ``first_token`` and ``finish`` return False for them.

The retry rule (:meth:`RequestLifecycle.fail`): a failed attempt is retried only if no byte
of it reached the client, the failure is not ``final``, the request has not been answered
with a 5xx by ``POISON_AFTER_5XX`` instances (then the request is the likely cause), fewer
than ``max_attempts`` attempts (migrations included: each is a send) were made, and the
policy, asked again over the current indicators with every instance that failed this
request excluded, finds an instance. Deciding again rather than walking the first
decision's scores: the failure changed the indicators (the attempt's load is gone, the
instance may be down), and the policy's own rules (session tables, hotspot routing) see
the retry.

The continuation rule: an attempt that fails once bytes of the answer reached the client
(``first_byte``, or a first token already accounted) is not retried but may be
*continued*: the driver re-issues the request with the text already sent, and splices the
new attempt's answer into the client's (the live router: :mod:`router_worker.continuation`).
A continuation is one more attempt of the same request, decided by the policy like a
retry (every instance that failed the request excluded), allowed while the failure is not
``final``, the driver found the request continuable (``not_continuable`` empty), and fewer
than ``max_continuations`` continuations were made (``max_attempts`` does not cap them:
they are the answer's, not the first byte's). Every failure after the first byte, the
continuation's own included, is judged by this rule.

``attempt_count`` is what both drivers report as a request's attempts: every attempt
routed (the first try, each retry, each migration), the count ``max_attempts`` caps.

Observers: a driver attaches what it does besides the accounting (the live router: its
peers, metrics, telemetry, decision and traffic capture; the simulator: its peer reports)
as :class:`LifecycleObserver` objects, gathered once per driver in
:class:`LifecycleObservers`; the lifecycle tells them of each transition once, after its
own accounting and feedback, of each failure with the retry rule's verdict, and of
:meth:`RequestLifecycle.close` (the driver is done with the request). A driver that keeps
more of a request than the lifecycle does subclasses it (the live router's
:class:`~router_worker.plan.Plan`), and its observers are typed for that subclass
(``LifecycleObserver[Plan]``): one object per request, no link back to break.

Migration (policies that set ``migrates``): after a dispatch, :func:`choose_migrations`
shows the policy the driver's requests queued on the instances the decision named and
returns the moves; the driver carries each one out (takes the attempt back, then
:meth:`RequestLifecycle.migrate`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Generic, TypeVar

import numpy as np

from router_worker.routing.features import RequestFeatures
from router_worker.routing.grey import GreyDetector
from router_worker.routing.indicators import ClusterState, ClusterView
from router_worker.routing.policies.base import (
    Decision,
    Migration,
    NoEligibleInstanceError,
    QueuedRequest,
    RoutingPolicy,
)

# A request answered with a 5xx by this many instances is taken for the cause (an input
# that trips an engine bug): no more retries.
POISON_AFTER_5XX = 2


def engine_refused(status: int) -> bool:
    """An engine that answers with ``status`` refused the request outright: a 4xx comes
    before any token (vLLM's 400 for a prompt over its context or a bad parameter, 404 for
    a model it does not serve). Its attempt is rejected (:meth:`RequestLifecycle.reject`),
    not finished, and not retried: another instance would refuse it alike."""
    return 400 <= status < 500


class IllegalTransition(RuntimeError):
    """A lifecycle method called in a phase where it makes no sense (a driver bug)."""


class Phase(StrEnum):
    ROUTED = "routed"
    DISPATCHED = "dispatched"
    FIRST_TOKEN = "first_token"
    FINISHED = "finished"
    FAILED = "failed"
    ABANDONED = "abandoned"
    MIGRATED = "migrated"
    REJECTED = "rejected"


OPEN = frozenset({Phase.ROUTED, Phase.DISPATCHED, Phase.FIRST_TOKEN})


@dataclass(slots=True)
class Attempt:
    """One send of the request to one instance."""

    instance: str
    decision: Decision | None  # None: a migration (the policy named the target)
    reason: str  # first | retry | migration | continuation
    routed_at: float
    phase: Phase = Phase.ROUTED
    dispatched_at: float | None = None
    first_token_at: float | None = None
    ended_at: float | None = None
    error: str | None = None  # the failure kind, when failed
    detail: str = ""  # the driver's account of the failure (for logs and events)
    final: bool = False  # failed for no fault of the instance's (no retry, no strike)
    uncached_tokens: int = 0  # prefill work as accounted at dispatch
    # A split request's decode attempt: it reads the prompt's KV from the prefill instance
    # and computes only the last token (router_worker.routing.disagg).
    remote_prefill: bool = False
    # The prefill work queued ahead of it (itself included) at dispatch, in seconds at
    # the state's nominal prefill throughput: the TTFT grey-failure detection expects.
    expected_ttft: float = 0.0
    # The cost model's decode step on that instance at its first token (grey detection's
    # expected TPOT is the mean of this and the step at its last token, plus the prefill
    # the instance completed in between, counted from these cumulative totals).
    expected_step: float = 0.0
    # The prefill work, s at the cost model's rates, the instance had completed for this
    # router at that first token (grey detection counts what it did between first and last
    # token).
    prefill_done_at_first: float = 0.0

    @property
    def open(self) -> bool:
        return self.phase in OPEN


Life = TypeVar("Life", bound="RequestLifecycle")


class LifecycleObserver(Generic[Life]):
    """Told of a request's transitions, each once, after the lifecycle's own accounting
    (except :meth:`sending`). Every hook is optional: these do nothing. The attempt
    carries the times (``routed_at``, ``dispatched_at``, ``first_token_at``,
    ``ended_at``). ``Life`` is the lifecycle class of the driver the observer serves:
    a driver's own subclass (the live router's :class:`~router_worker.plan.Plan`) carries
    what only it keeps, typed, with no link back to be broken."""

    __slots__ = ()

    def routed(self, life: Life, attempt: Attempt) -> None:
        """The policy decided ``attempt`` (the first try or a retry)."""

    def sending(self, life: Life, attempt: Attempt) -> None:
        """``attempt`` was sent and is about to be accounted: the indicators are still
        those it was decided on."""

    def dispatched(self, life: Life, attempt: Attempt) -> None:
        """``attempt`` was sent and accounted (``uncached_tokens`` set)."""

    def first_token(self, life: Life, attempt: Attempt) -> None:
        """``attempt``'s first token was accounted."""

    def ended(self, life: Life, attempt: Attempt) -> None:
        """``attempt``, once dispatched, ended: its ``phase`` says how (finished, failed,
        abandoned, migrated, rejected). An attempt that ends before it was sent (a
        connection refused) was never dispatched, and is not reported."""

    def failed(self, life: Life, attempt: Attempt) -> None:
        """``attempt`` failed, dispatched or not (its ``error``, ``detail`` and ``final``
        say how), after its indicators went and before the retry rule decides: what this
        hook changes (an instance's health) the retry's decision sees. The verdict is
        ``life.verdict`` afterwards."""

    def closed(self, life: Life, outcome: Any) -> None:
        """The driver is done with the request (:meth:`RequestLifecycle.close`);
        ``outcome`` is the driver's account of how it ended for its client."""


HOOKS = ("routed", "sending", "dispatched", "first_token", "ended", "failed", "closed")


class LifecycleObservers:
    """A driver's observers, as a lifecycle calls them: per hook, the bound methods of the
    observers that define it (a hook left as :class:`LifecycleObserver`'s is never
    called). Built once per driver, shared by its requests' lifecycles."""

    __slots__ = ("all", *HOOKS)

    def __init__(self, *observers: LifecycleObserver[Any]) -> None:
        self.all = observers
        for hook in HOOKS:
            noop = getattr(LifecycleObserver, hook)
            listening = [getattr(o, hook) for o in observers if getattr(type(o), hook) is not noop]
            setattr(self, hook, tuple(listening))

    routed: tuple[Callable[[Any, Attempt], None], ...]
    sending: tuple[Callable[[Any, Attempt], None], ...]
    dispatched: tuple[Callable[[Any, Attempt], None], ...]
    first_token: tuple[Callable[[Any, Attempt], None], ...]
    ended: tuple[Callable[[Any, Attempt], None], ...]
    failed: tuple[Callable[[Any, Attempt], None], ...]
    closed: tuple[Callable[[Any, Any], None], ...]


NO_OBSERVERS = LifecycleObservers()


@dataclass(frozen=True, slots=True)
class RetryVerdict:
    """What :meth:`RequestLifecycle.fail` decided. ``attempt`` is the new (routed) attempt
    when ``retry``; ``why`` says which part of the rule decided."""

    retry: bool
    # retry | first_byte | final | poison | exhausted | no_instance (before the first byte);
    # continuation | first_byte | not_continuable | continuations_exhausted | no_instance
    # (after it)
    why: str
    attempt: Attempt | None = None

    @property
    def decided(self) -> bool:
        """The policy was asked (successfully or not)."""
        return self.why in ("retry", "continuation", "no_instance")


def choose_migrations(
    decided: RequestLifecycle,
    waiting: Iterable[RequestLifecycle],
    can_take_back: Callable[[RequestLifecycle], bool],
    view: ClusterView,
    now: float,
) -> list[Migration]:
    """The moves ``decided``'s (migrating) policy makes once ``decided``'s attempt was
    dispatched. The policy is shown the requests of ``waiting`` (the driver's own
    dispatched requests without a first token, in the driver's order, ``decided`` among
    them) queued on the instances ``decided``'s decision named; each is ``movable`` if the
    driver ``can_take_back`` its attempt (the simulator: the engine has not admitted it;
    the live router: no byte came back) and the lifecycle allows one more attempt. Pure:
    both drivers call it and carry out what it returns."""
    names = decided.named_instances
    queued = []
    for life in waiting:
        attempt = life.current
        if attempt.instance not in names:
            continue
        queued.append(
            QueuedRequest(
                life.features,
                attempt.instance,
                now if attempt.dispatched_at is None else attempt.dispatched_at,
                attempt.uncached_tokens,
                _candidates(life.decision),
                can_take_back(life) and life.movable,
            )
        )
    return list(decided.policy.migrations(view, queued, now))


def _candidates(decision: Decision | None) -> tuple[str, ...]:
    return () if decision is None else tuple(decision.details.get("candidates", ()))


class _ExcludingView:
    """A view whose ``eligible`` leaves out some slots; everything else is the base view's."""

    def __init__(self, base: ClusterView, excluded: list[int]) -> None:
        self._base = base
        self._excluded = excluded

    @property
    def eligible(self) -> np.ndarray:
        mask = np.array(self._base.eligible, dtype=bool)
        mask[self._excluded] = False
        return mask

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)


@dataclass(slots=True)
class RequestLifecycle:
    """A request's attempts and the transitions between them (see the module docstring)."""

    features: RequestFeatures
    policy: RoutingPolicy
    state: ClusterState
    max_attempts: int = 3
    # Continuations of an answer broken after its first byte (0: none, the stream ends
    # with an error); ``not_continuable``: the driver's reason why this request cannot be.
    max_continuations: int = 0
    not_continuable: str = ""
    attempts: list[Attempt] = field(default_factory=list)
    answered_5xx: list[str] = field(default_factory=list)
    observers: LifecycleObservers = NO_OBSERVERS
    closed_at: float | None = None
    # The last decision the policy made for this request (the first try's or a retry's; a
    # migration's target is the policy's choice but no decision).
    decision: Decision | None = field(default=None, init=False)
    # What the retry rule said of the last failed attempt (None: none failed).
    verdict: RetryVerdict | None = field(default=None, init=False)

    # ----- queries ------------------------------------------------------------------
    @property
    def request_id(self) -> str:
        return self.features.request_id

    @property
    def current(self) -> Attempt:
        if not self.attempts:
            raise IllegalTransition(f"request {self.request_id}: not routed yet")
        return self.attempts[-1]

    @property
    def failed_instances(self) -> list[str]:
        return [a.instance for a in self.attempts if a.phase is Phase.FAILED]

    @property
    def named_instances(self) -> set[str]:
        """The current attempt's instance and the candidates the last decision named (the
        instances a migrating policy looks at after this request's dispatch)."""
        return {self.current.instance, *_candidates(self.decision)}

    @property
    def decisions(self) -> int:
        """Attempts the policy decided (first try and retries, not migrations)."""
        return sum(1 for a in self.attempts if a.decision is not None)

    @property
    def attempt_count(self) -> int:
        """Attempts made: the first try, each retry and each migration (every attempt
        routed, sent or not). What ``max_attempts`` caps, and what the live router's
        decision records and the simulator's request results call ``attempts``."""
        return len(self.attempts)

    @property
    def continuations(self) -> int:
        """Attempts that continued an answer broken after its first byte."""
        return sum(1 for a in self.attempts if a.reason == "continuation")

    @property
    def can_send_again(self) -> bool:
        return self.attempt_count < self.max_attempts

    @property
    def awaiting_first_token(self) -> bool:
        """The current attempt was sent and has no first token yet: the next token the
        driver sees is its first."""
        return bool(self.attempts) and self.current.phase is Phase.DISPATCHED

    @property
    def movable(self) -> bool:
        """The current attempt may still be taken back and the request sent elsewhere
        (:meth:`migrate`): sent, no first token yet, and an attempt left under
        ``max_attempts``. Drivers add what only they know (the engine has not admitted
        it, no byte came back) and tell the policy in ``QueuedRequest.movable``."""
        return self.awaiting_first_token and self.can_send_again

    # ----- transitions ----------------------------------------------------------------
    def route(self, view: ClusterView, now: float) -> Attempt:
        """Ask the policy for the first attempt's instance (raises NoEligibleInstanceError)."""
        if self.attempts:
            raise IllegalTransition(f"request {self.request_id}: already routed")
        return self._decide(view, now, "first")

    def next_stage(
        self, policy: RoutingPolicy, view: ClusterView, now: float, reason: str
    ) -> Attempt:
        """Open the next stage's attempt once the current one has ended: a split
        request's decode after its prefill (``reason`` decode), or a colocated fallback
        (``reason`` fallback). ``policy`` decides it and the stage's retries; instances that
        failed the request stay excluded. Raises NoEligibleInstanceError."""
        if self.attempts and self.current.open:
            raise IllegalTransition(
                f"request {self.request_id}: next stage while {self.current.phase.value}"
            )
        self.policy = policy
        attempt = self._decide(view, now, reason)
        attempt.remote_prefill = reason == "decode"
        return attempt

    def dispatch(self, now: float) -> int:
        """The current attempt was sent: account it; returns its uncached prompt tokens."""
        attempt = self._expect(Phase.ROUTED, "dispatch")
        for hook in self.observers.sending:
            hook(self, attempt)
        cached = attempt.decision.cached_tokens if attempt.decision is not None else None
        if attempt.remote_prefill:
            cached = max(self.features.prompt_tokens - 1, 0)
        attempt.uncached_tokens = self.state.on_dispatch(
            self.features, attempt.instance, now, cached_tokens=cached
        )
        attempt.phase, attempt.dispatched_at = Phase.DISPATCHED, now
        state = self.state
        if state.grey is not None and state.grey.judging:
            pending = float(state.pending[state.slot_of(attempt.instance)])
            attempt.expected_ttft = pending / state.default_prefill_tps
        for hook in self.observers.dispatched:
            hook(self, attempt)
        return attempt.uncached_tokens

    def first_token(self, now: float, ttft: float, attempt: Attempt | None = None) -> bool:
        """The first token of ``attempt`` (default: the current one) reached the router
        ``ttft`` s after arrival. False: that attempt had already ended (a late report)."""
        attempt = attempt or self.current
        if not attempt.open:
            return False
        if attempt.phase is not Phase.DISPATCHED:
            raise IllegalTransition(
                f"request {self.request_id}: first token while {attempt.phase.value}"
            )
        attempt.phase, attempt.first_token_at = Phase.FIRST_TOKEN, now
        if self.state.is_in_flight(self.request_id):
            self.state.on_first_token(self.request_id, now)
        self.policy.observe_first_token(self.features, attempt.instance, ttft, now)
        grey = self.state.grey
        if grey is not None and grey.judging:
            attempt.expected_step = self._decode_step(grey, attempt.instance)
            done = self.state.prefill_progress(attempt.instance)
            attempt.prefill_done_at_first = grey.expected_prefill(done.tokens, done.pairs)
            if grey.params.use_ttft and attempt.dispatched_at is not None:
                measured = now - attempt.dispatched_at
                grey.observe(attempt.instance, "ttft", measured, attempt.expected_ttft, now)
        for hook in self.observers.first_token:
            hook(self, attempt)
        return True

    def finish(
        self, now: float, output_tokens: int, *, ok: bool = True, attempt: Attempt | None = None
    ) -> bool:
        """``attempt`` (default: the current one) ended with an answer; ``ok`` False for an
        answer that is no success (no feedback then). False: it had already ended."""
        attempt = attempt or self.current
        if not attempt.open:
            return False
        if attempt.phase is Phase.ROUTED:
            raise IllegalTransition(f"request {self.request_id}: finished before dispatch")
        grey = self.state.grey
        if grey is not None and grey.judging and ok:
            self._observe_tpot(grey, attempt, now, output_tokens)
        self._close(attempt, Phase.FINISHED, now, error=False)
        if ok and output_tokens > 0:  # 0: the engine reported no usage
            self.policy.observe_finish(self.features, attempt.instance, output_tokens, now)
        self._ended(attempt)
        return True

    def abandon(self, now: float) -> None:
        """The client went away: the current attempt is given up (engine aborts it)."""
        attempt = self.current
        if not attempt.open:
            raise IllegalTransition(
                f"request {self.request_id}: abandoned while {attempt.phase.value}"
            )
        self._close(attempt, Phase.ABANDONED, now, error=True)

    def reject(self, now: float) -> None:
        """The engine refused the dispatched attempt outright (vLLM's 400, see
        :func:`engine_refused`): an error for the indicators, no feedback, no retry."""
        attempt = self._expect(Phase.DISPATCHED, "reject")
        self._close(attempt, Phase.REJECTED, now, error=True)

    def migrate(self, target: str, now: float) -> Attempt:
        """Take the current attempt back before its first token and open one on ``target``
        (to be dispatched). Only while :attr:`movable`: a migration is an attempt."""
        attempt = self._expect(Phase.DISPATCHED, "migrate")
        if not self.can_send_again:
            raise IllegalTransition(
                f"request {self.request_id}: cannot migrate, {self.attempt_count} of "
                f"{self.max_attempts} attempts made"
            )
        self._close(attempt, Phase.MIGRATED, now, error=False)
        new = Attempt(target, None, "migration", now)
        self.attempts.append(new)
        return new

    def fail(
        self,
        view: ClusterView,
        now: float,
        kind: str,
        *,
        final: bool = False,
        first_byte: bool = False,
        detail: str = "",
    ) -> RetryVerdict:
        """The current attempt failed (``kind``: connect, timeout, http_5xx, ...; ``detail``
        the driver's words for it). Applies the retry rule (module docstring); on a retry
        the new attempt is routed. ``first_byte``: the driver knows a byte went out even if
        the indicators have not heard of it yet (the simulator's telemetry delay).
        ``final``: no fault of the instance's, and another would fare no better."""
        attempt = self.current
        if not attempt.open:
            raise IllegalTransition(
                f"request {self.request_id}: failed while {attempt.phase.value}"
            )
        streamed = first_byte or attempt.phase is Phase.FIRST_TOKEN
        attempt.error, attempt.detail, attempt.final = kind, detail, final
        if kind == "http_5xx":
            self.answered_5xx.append(attempt.instance)
        self._close(attempt, Phase.FAILED, now, error=True)
        for hook in self.observers.failed:
            hook(self, attempt)
        verdict = self.verdict = self._retry_verdict(view, now, streamed, final)
        return verdict

    def answer(self, now: float, status: int, output_tokens: int, *, ok: bool) -> None:
        """The driver has the engine's answer (``status``) for the current attempt, if it is
        still open: a 4xx before any token rejects it (:func:`engine_refused`), anything
        else finishes it."""
        attempt = self.current
        if attempt.phase is Phase.DISPATCHED and engine_refused(status):
            self.reject(now)
        elif attempt.phase in (Phase.DISPATCHED, Phase.FIRST_TOKEN):
            self.finish(now, output_tokens, ok=ok)

    def _retry_verdict(
        self, view: ClusterView, now: float, streamed: bool, final: bool
    ) -> RetryVerdict:
        if streamed:
            return self._continuation_verdict(view, now, final)
        if final:
            return RetryVerdict(False, "final")
        if len(self.answered_5xx) >= POISON_AFTER_5XX:
            return RetryVerdict(False, "poison")
        if not self.can_send_again:
            return RetryVerdict(False, "exhausted")
        try:
            return RetryVerdict(True, "retry", self._decide(view, now, "retry"))
        except NoEligibleInstanceError:
            return RetryVerdict(False, "no_instance")

    def _continuation_verdict(self, view: ClusterView, now: float, final: bool) -> RetryVerdict:
        if final or self.max_continuations == 0:
            return RetryVerdict(False, "first_byte")
        if self.not_continuable:
            return RetryVerdict(False, "not_continuable")
        if self.continuations >= self.max_continuations:
            return RetryVerdict(False, "continuations_exhausted")
        try:
            return RetryVerdict(True, "continuation", self._decide(view, now, "continuation"))
        except NoEligibleInstanceError:
            return RetryVerdict(False, "no_instance")

    def close(self, now: float, outcome: Any = None) -> bool:
        """The driver is done with the request (answered, or given up): observers'
        ``closed`` hear of it with ``outcome``. The attempts are the driver's to end first.
        False: it was closed already (nothing is reported twice)."""
        if self.closed_at is not None:
            return False
        self.closed_at = now
        for hook in self.observers.closed:
            hook(self, outcome)
        return True

    # ----- internals ------------------------------------------------------------------
    def _decode_step(self, grey: GreyDetector, instance: str) -> float:
        """The cost model's decode step on ``instance`` now, its batch as the router
        counts it (this request included while it decodes)."""
        view = self.state.view()
        slot = self.state.slot_of(instance)
        return grey.expected_step(
            float(view.batch_size[slot]), float(view.decode_context_tokens[slot])
        )

    def _observe_tpot(
        self, grey: GreyDetector, attempt: Attempt, now: float, output_tokens: int
    ) -> None:
        """Grey detection's TPOT sample: measured against the cost model's step over the
        batch the request decoded in (at its first token and at its last, averaged), plus
        the prefill the instance ran in between (chunked prefill runs it in the same
        steps), spread over the request's decode steps.

        That prefill is the prompts that reached their first token there in between, and
        the share of the one it is still prefilling that it had got through: a short decode
        sharing its steps with a long prompt's chunks ends in the same step as that prompt's
        first token, or before it. The share is in time, known once that prompt's prefill
        ends, so the sample waits for it: (this decode's end − its prefill's start) /
        (its first token − its prefill's start) of its work, measured on the instance
        itself, so a slow instance is not credited work it did not do."""
        if attempt.first_token_at is None or output_tokens < 2:
            return
        span = now - attempt.first_token_at
        if span < grey.params.min_decode_s:
            return  # mostly the router's own scheduling jitter
        instance, state = attempt.instance, self.state
        progress = state.prefill_progress(instance)
        done = grey.expected_prefill(progress.tokens, progress.pairs)
        done -= attempt.prefill_done_at_first
        steps = output_tokens - 1
        step = 0.5 * (attempt.expected_step + self._decode_step(grey, instance))
        measured = span / steps
        head, since = progress.head_id, progress.head_since
        work = grey.expected_prefill(progress.head_tokens, progress.head_pairs)
        if head is None or since >= now or work <= 0:
            grey.observe(instance, "tpot", measured, step + done / steps, now)
            return
        end = now

        def prefilled(at: float, started: bool) -> None:
            """The prompt ``head`` reached its first token at ``at`` (``started``), or
            ended there without one (never prefilled: no share)."""
            share = 0.0
            if started:
                share = min((end - since) / (at - since), 1.0) if at > since else 1.0
            expected = step + (done + work * share) / steps
            grey.observe(instance, "tpot", measured, expected, max(at, end))

        state.when_prefilled(head, prefilled)

    def _decide(self, view: ClusterView, now: float, reason: str) -> Attempt:
        failed = self.failed_instances
        slots = [view.ids.index(name) for name in failed if name in view.ids]
        grey = self.state.grey
        if grey is not None:
            slow = grey.excluded(view.ids, now)
            if slow and np.any(np.delete(view.eligible, slots + slow)):
                slots += slow  # never all of them: a slow instance beats none
        if slots:
            view = _ExcludingView(view, slots)  # type: ignore[assignment]
        decision = self.policy.decide(self.features, view, now)
        attempt = Attempt(decision.instance_id, decision, reason, now)
        self.attempts.append(attempt)
        self.decision = decision
        for hook in self.observers.routed:
            hook(self, attempt)
        return attempt

    def _expect(self, phase: Phase, what: str) -> Attempt:
        attempt = self.current
        if attempt.phase is not phase:
            raise IllegalTransition(
                f"request {self.request_id}: cannot {what} while {attempt.phase.value}"
            )
        return attempt

    def _close(self, attempt: Attempt, phase: Phase, now: float, *, error: bool) -> None:
        """End ``attempt``; its indicators go if it was dispatched (exactly once), and the
        observers hear of it (after the feedback of a finish)."""
        if attempt.phase is Phase.ROUTED:
            attempt.phase, attempt.ended_at = phase, now
            return
        attempt.phase, attempt.ended_at = phase, now
        if self.state.is_in_flight(self.request_id):
            if error:
                self.state.on_error(self.request_id, now)
            else:
                self.state.on_finish(self.request_id, now)
        if phase is not Phase.FINISHED:
            self._ended(attempt)

    def _ended(self, attempt: Attempt) -> None:
        for hook in self.observers.ended:
            hook(self, attempt)
