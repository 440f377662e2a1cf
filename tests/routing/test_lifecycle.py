"""RequestLifecycle: each transition's accounting and feedback (once), the retry rule,
migration, late reports and illegal transitions."""

from __future__ import annotations

import pytest

from router_worker.routing import (
    ClusterState,
    IllegalTransition,
    Phase,
    RequestFeatures,
    RequestLifecycle,
)
from router_worker.routing.lifecycle import engine_refused
from router_worker.routing.policies.least_load import LeastLoadPolicy
from tests.routing.helpers import add_pending, cluster, features, tokens


class CountingPolicy(LeastLoadPolicy):
    """least_load, noting the feedback it is given."""

    def __init__(self) -> None:
        super().__init__(seed=1)
        self.first_tokens: list[tuple[str, str, float]] = []
        self.finishes: list[tuple[str, str, int]] = []
        self.decided = 0

    def decide(self, request, view, now):
        self.decided += 1
        return super().decide(request, view, now)

    def observe_first_token(
        self, request: RequestFeatures, instance_id: str, ttft: float, now: float
    ) -> None:
        self.first_tokens.append((request.request_id, instance_id, ttft))

    def observe_finish(
        self, request: RequestFeatures, instance_id: str, output_tokens: int, now: float
    ) -> None:
        self.finishes.append((request.request_id, instance_id, output_tokens))


def _life(
    state: ClusterState,
    max_attempts: int = 3,
    prompt: int = 64,
) -> tuple[RequestLifecycle, CountingPolicy]:
    policy = CountingPolicy()
    request = features(tokens(1000, prompt))
    return RequestLifecycle(request, policy, state, max_attempts=max_attempts), policy


def _sent(life: RequestLifecycle, state: ClusterState, now: float = 1.0) -> str:
    instance = life.route(state.view(), now).instance
    life.dispatch(now)
    return instance


def test_each_transition_accounts_once_and_feeds_back_once() -> None:
    state = cluster(3)
    life, policy = _life(state)
    attempt = life.route(state.view(), 1.0)
    assert attempt.phase is Phase.ROUTED and state.in_flight.sum() == 0  # decided, not sent
    assert life.dispatch(1.0) == 64
    slot = state.slot_of(attempt.instance)
    assert (state.pending[slot], state.in_flight[slot]) == (64, 1)
    assert life.first_token(2.0, ttft=1.0)
    assert (state.pending[slot], state.decoding[slot]) == (0, 1)
    assert policy.first_tokens == [(life.request_id, attempt.instance, 1.0)]
    assert life.finish(3.0, output_tokens=5)
    assert (state.in_flight[slot], state.decoding[slot], state.error_count) == (0, 0, 0)
    assert policy.finishes == [(life.request_id, attempt.instance, 5)]
    # a late (duplicate) report of the ended attempt changes nothing
    assert not life.finish(4.0, output_tokens=5)
    assert not life.first_token(4.0, ttft=3.0)
    assert len(policy.finishes) == len(policy.first_tokens) == 1
    assert attempt.phase is Phase.FINISHED and (attempt.dispatched_at, attempt.ended_at) == (
        1.0,
        3.0,
    )


def test_an_answer_that_is_no_success_is_accounted_without_feedback() -> None:
    state = cluster(2)
    life, policy = _life(state)
    _sent(life, state)
    assert life.finish(2.0, output_tokens=0, ok=False)
    assert state.in_flight.sum() == 0 and policy.finishes == []


def test_a_retry_decides_again_without_the_failed_instance() -> None:
    state = cluster(3)
    add_pending(state, "i1", 10)
    add_pending(state, "i2", 10)
    life, policy = _life(state)
    failed = _sent(life, state)
    assert failed == "i0"  # the only idle instance
    verdict = life.fail(state.view(), 2.0, "connect")
    # The failed attempt's load is gone, so i0 is the least loaded again: only the rule's
    # exclusion keeps the retry off it.
    assert state.in_flight[0] == 0 and state.error_count == 1
    assert verdict.retry and verdict.why == "retry" and policy.decided == 2
    assert verdict.attempt is not None and verdict.attempt.instance in ("i1", "i2")
    assert verdict.attempt.reason == "retry" and life.current is verdict.attempt
    assert life.failed_instances == ["i0"]
    life.dispatch(2.0)
    assert state.in_flight[state.slot_of(verdict.attempt.instance)] == 2


def test_no_retry_once_a_byte_went_out() -> None:
    state = cluster(3)
    life, policy = _life(state)
    _sent(life, state)
    life.first_token(2.0, ttft=1.0)
    verdict = life.fail(state.view(), 3.0, "mid_stream")
    assert (verdict.retry, verdict.why, policy.decided) == (False, "first_byte", 1)
    assert state.in_flight.sum() == 0 and state.error_count == 1
    # the driver may know of the byte before the indicators do (telemetry delay)
    other, policy = _life(state)
    _sent(other, state)
    assert other.fail(state.view(), 3.0, "instance_down", first_byte=True).why == "first_byte"


def test_the_attempt_cap_counts_migrations() -> None:
    state = cluster(4)
    life, _ = _life(state, max_attempts=3)
    _sent(life, state)
    assert life.fail(state.view(), 2.0, "connect").retry
    life.dispatch(2.0)
    life.migrate("i3" if life.current.instance != "i3" else "i2", 3.0)
    life.dispatch(3.0)
    verdict = life.fail(state.view(), 4.0, "timeout")
    assert (verdict.retry, verdict.why, len(life.attempts), life.decisions) == (
        False,
        "exhausted",
        3,
        2,
    )
    assert state.in_flight.sum() == 0


def test_final_failures_and_poison_are_not_retried() -> None:
    state = cluster(4)
    life, _ = _life(state, max_attempts=5)
    _sent(life, state)
    assert life.fail(state.view(), 2.0, "fd_exhausted", final=True).why == "final"
    poisoned, _ = _life(state, max_attempts=5)
    _sent(poisoned, state)
    first = poisoned.fail(state.view(), 2.0, "http_5xx")
    assert first.retry  # one instance's 5xx: maybe that instance
    poisoned.dispatch(2.0)
    second = poisoned.fail(state.view(), 3.0, "http_5xx")
    assert (second.retry, second.why) == (False, "poison")  # alike on two: the request


def test_no_retry_when_every_instance_failed_it() -> None:
    state = cluster(2)
    life, _ = _life(state)
    _sent(life, state)
    assert life.fail(state.view(), 2.0, "connect").retry
    life.dispatch(2.0)
    verdict = life.fail(state.view(), 3.0, "connect")
    assert (verdict.retry, verdict.why, verdict.decided) == (False, "no_instance", True)


def test_a_failure_before_dispatch_is_not_accounted() -> None:
    state = cluster(2)
    life, _ = _life(state)
    life.route(state.view(), 1.0)
    assert life.fail(state.view(), 1.5, "connect").retry
    assert state.error_count == 0 and state.in_flight.sum() == 0


def test_migration_moves_the_accounting_to_the_target() -> None:
    state = cluster(3)
    life, policy = _life(state)
    source = _sent(life, state)
    target = "i2" if source != "i2" else "i1"
    new = life.migrate(target, 2.0)
    assert life.attempts[0].phase is Phase.MIGRATED and state.error_count == 0
    assert state.in_flight.sum() == 0  # taken back: a finish, not an error
    assert (new.instance, new.decision, new.reason, new.phase) == (
        target,
        None,
        "migration",
        Phase.ROUTED,
    )
    life.dispatch(2.0)
    assert state.in_flight[state.slot_of(target)] == 1 and policy.decided == 1
    life.first_token(3.0, ttft=2.0)
    life.finish(4.0, output_tokens=3)
    assert policy.first_tokens == [(life.request_id, target, 2.0)]
    assert policy.finishes == [(life.request_id, target, 3)]


def test_abandon_and_reject_end_the_attempt_as_errors() -> None:
    state = cluster(2)
    life, _ = _life(state)
    _sent(life, state)
    life.abandon(2.0)
    assert life.current.phase is Phase.ABANDONED and state.error_count == 1
    rejected, _ = _life(state)
    _sent(rejected, state)
    rejected.reject(2.0)
    assert rejected.current.phase is Phase.REJECTED and state.error_count == 2
    assert state.in_flight.sum() == 0


@pytest.mark.parametrize(
    "status, refused",
    [
        (200, False),
        (201, False),
        (302, False),
        (400, True),
        (404, True),
        (422, True),
        (429, True),
        (500, False),
        (503, False),
    ],
)
def test_an_engines_4xx_is_a_refusal(status: int, refused: bool) -> None:
    assert engine_refused(status) is refused


def test_a_refused_attempt_is_rejected_not_finished() -> None:
    """What the live router does with an engine's 4xx and the simulator with its engine's
    refusal: the attempt is REJECTED, an error for the indicators, no feedback, and the
    request is over (nothing left to finish, fail or retry)."""
    state = cluster(3)
    life, policy = _life(state)
    _sent(life, state)
    life.reject(2.0)
    assert [a.phase for a in life.attempts] == [Phase.REJECTED]
    assert (state.in_flight.sum(), state.pending.sum(), state.error_count) == (0, 0, 1)
    assert policy.finishes == [] and policy.first_tokens == []
    assert not life.finish(3.0, output_tokens=0, ok=False)  # a late report: ignored
    assert life.current.phase is Phase.REJECTED and state.error_count == 1
    with pytest.raises(IllegalTransition):
        life.fail(state.view(), 3.0, "http_5xx")
    assert (life.attempt_count, policy.decided) == (1, 1)


def test_attempt_count_is_every_attempt_routed() -> None:
    """The one definition of a request's attempts both drivers report: first try, retries
    and migrations; a retry the policy found no instance for adds none."""
    state = cluster(3)
    life, policy = _life(state, max_attempts=5)
    assert life.attempt_count == 0
    life.route(state.view(), 1.0)
    assert life.attempt_count == 1  # routed, not sent yet: an attempt all the same
    assert life.fail(state.view(), 1.5, "connect").retry  # e.g. refused before sending
    assert life.attempt_count == 2
    life.dispatch(2.0)
    taken = {*life.failed_instances, life.current.instance}
    life.migrate(next(i for i in state.ids if i not in taken), 2.5)
    assert (life.attempt_count, life.decisions) == (3, 2)
    life.dispatch(2.5)
    assert life.fail(state.view(), 3.0, "connect").retry
    life.dispatch(3.0)
    verdict = life.fail(state.view(), 4.0, "connect")  # all three instances failed it
    assert (verdict.why, verdict.decided) == ("no_instance", True)
    assert (life.attempt_count, policy.decided) == (4, 4)  # asked 4 times, 4 attempts


def test_a_migration_needs_an_attempt_left() -> None:
    state = cluster(3)
    life, _ = _life(state, max_attempts=2)
    assert not life.awaiting_first_token and not life.movable  # nothing routed
    life.route(state.view(), 1.0)
    assert not life.awaiting_first_token and not life.movable  # not sent
    life.dispatch(1.0)
    assert life.awaiting_first_token and life.movable
    life.migrate("i2" if life.current.instance != "i2" else "i1", 2.0)
    life.dispatch(2.0)
    assert life.awaiting_first_token and not life.movable  # 2 of 2 attempts made
    in_flight = state.in_flight.sum()
    with pytest.raises(IllegalTransition):
        life.migrate("i0", 3.0)
    assert (life.attempt_count, state.in_flight.sum()) == (2, in_flight)
    life.first_token(3.0, ttft=2.0)
    assert not life.awaiting_first_token and not life.movable


@pytest.mark.parametrize(
    "steps, illegal",
    [
        ([], "dispatch"),  # nothing routed
        (["route"], "route"),  # routed twice
        (["route"], "first_token"),  # before it was sent
        (["route"], "finish"),
        (["route"], "migrate"),
        (["route", "dispatch"], "dispatch"),  # sent twice
        (["route", "dispatch", "first_token"], "first_token"),
        (["route", "dispatch", "first_token"], "migrate"),  # bytes went out
        (["route", "dispatch", "finish"], "abandon"),
        (["route", "dispatch", "finish"], "fail"),
        (["route", "dispatch", "finish"], "migrate"),
        (["route", "dispatch", "abandon"], "reject"),
    ],
)
def test_illegal_transitions_raise(steps: list[str], illegal: str) -> None:
    state = cluster(2)
    life, _ = _life(state)
    calls = {
        "route": lambda: life.route(state.view(), 1.0),
        "dispatch": lambda: life.dispatch(1.0),
        "first_token": lambda: life.first_token(2.0, ttft=1.0),
        "finish": lambda: life.finish(3.0, output_tokens=2),
        "abandon": lambda: life.abandon(3.0),
        "reject": lambda: life.reject(3.0),
        "fail": lambda: life.fail(state.view(), 3.0, "connect"),
        "migrate": lambda: life.migrate("i1", 3.0),
    }
    for step in steps:
        calls[step]()
    in_flight, errors = state.in_flight.sum(), state.error_count
    with pytest.raises(IllegalTransition):
        calls[illegal]()
    assert (state.in_flight.sum(), state.error_count) == (in_flight, errors)  # untouched
