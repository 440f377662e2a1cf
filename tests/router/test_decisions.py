"""The sampled decision stream, in process: which decisions the router keeps for the live
view, and what their records carry. The unit tests drive the real router core directly
(planned and finished as the request path does, no engine); the last test runs a router process
against enginesim and a private Redis."""

from __future__ import annotations

import gc
import json
import time
import weakref

import httpx
import numpy as np
import redis

from devharness import wait_until
from router_worker.contract import telemetry as contract
from router_worker.contract.config import parse_config
from router_worker.contract.telemetry import DecisionRecord
from router_worker.core import Plan, RouterCore
from router_worker.decisions import DecisionSampler, TokenBucket, candidate_rows, is_priority
from router_worker.intake import Intake, take_in
from router_worker.metrics import RouterMetrics
from router_worker.observers import RECENT_DECISIONS
from router_worker.routing import Decision
from router_worker.telemetry import DECISION_BUFFER, Telemetry
from tests.router.client_keys import DEBUG_KEY, debug_key_only
from tests.router.helpers import router_config, stream_entries

MODEL = "Qwen/Qwen2-7B-Instruct"


def make_core(
    instances: int = 3,
    canary: dict | None = None,
    sampler: DecisionSampler | None = None,
    policy: str = "lmetric",
) -> RouterCore:
    document = {
        "cluster": "unit",
        "model": MODEL,
        "version": 4,
        "instances": [
            {"name": f"i{k}", "url": f"http://127.0.0.1:{1 + k}"} for k in range(instances)
        ],
        "policy": {"kind": policy, "params": {}},
    }
    if canary is not None:
        document["canary"] = canary
    core = RouterCore("r-unit", Telemetry("r-unit", None), RouterMetrics())
    core.apply_config(parse_config(document))
    if sampler is not None:
        core.sampler = sampler
    return core


def _intake(core: RouterCore, prompt: str) -> Intake:
    """The request as the request path's intake step hands it to the core."""
    runtime = core.runtime
    assert runtime is not None
    body = json.dumps({"model": MODEL, "prompt": prompt}).encode()
    return take_in(body, "completions", runtime.tokenizer, runtime.config.block_size)


def route(
    core: RouterCore, prompt: str, *, session: str | None = None, fail_first: bool = False
) -> Plan:
    """Plan, dispatch and finish one request the way the request path drives the core."""
    assert core.runtime is not None
    headers = {"x-session-id": session} if session else {}
    plan = core.plan(core.runtime, _intake(core, prompt), headers, time.perf_counter())
    if fail_first:
        plan.sent()
        assert plan.attempt_failed("connect").retry
    plan.sent()
    plan.first_token_sent()
    plan.done(status=200, ok=True, output_tokens=4, last_token_at=None, cached_tokens=None)
    return plan


def shipped(core: RouterCore) -> list[DecisionRecord]:
    return list(core.telemetry._decisions)


def test_token_bucket_allows_bursts_then_the_rate() -> None:
    bucket = TokenBucket(rate=2.0, burst=3.0)
    assert [bucket.take(10.0) for _ in range(4)] == [True, True, True, False]
    assert bucket.take(10.4) is False  # 0.8 of a token refilled
    assert bucket.take(10.5) is True  # one whole token
    assert [bucket.take(20.0) for _ in range(4)] == [True, True, True, False]  # capped


def test_priority_decisions_pass_while_routine_ones_are_skipped() -> None:
    sampler = DecisionSampler(routine=(1.0, 2.0), priority=(5.0, 3.0))
    routine = [sampler.admit(False, 0.0) for _ in range(5)]
    priority = [sampler.admit(True, 0.0) for _ in range(5)]
    assert routine == [True, True, False, False, False]
    assert priority == [True, True, True, False, False]  # a storm stays bounded too
    assert sampler.kept == {"routine": 2, "priority": 3}
    assert sampler.skipped == {"routine": 3, "priority": 2}


def test_fallbacks_and_hotspot_classes_are_priority() -> None:
    def decision(reason: str, **details) -> Decision:
        return Decision("i0", 0, reason, 0, ("i0", "i1"), np.array([1.0, 2.0]), details)

    assert not is_priority(decision("score"))
    assert is_priority(decision("hotspot_fallback", hot_class="00ab"))
    assert is_priority(decision("imbalance_fallback"))
    assert is_priority(decision("score", hot_class="00ab"))


def test_sampled_records_carry_scores_and_indicators_and_round_trip() -> None:
    core = make_core(sampler=DecisionSampler(routine=(0.0, 3.0)))
    prompt = "shared prefix " * 40
    plans = [route(core, prompt + f"question {n}") for n in range(8)]
    records = shipped(core)
    assert [r.request_id for r in records] == [p.request_id for p in plans[:3]]
    last = records[-1]
    assert (last.cluster, last.router, last.arm, last.policy) == (
        "unit",
        "r-unit",
        "default",
        "lmetric",
    )
    assert last.instance == plans[2].instance and last.reason == "score"
    assert last.status == 200 and last.ttft_s is not None and last.canary is None
    assert last.candidates_total == 3 and len(last.candidates) == 3
    scores = [c.score for c in last.candidates if c.score is not None]
    assert len(scores) == 3  # every candidate scored
    assert scores == sorted(scores) and last.candidates[0].instance == last.instance
    table = plans[2].decision.score_table()  # what the x-switchyard-scores header carries
    assert {c.instance: c.score for c in last.candidates} == table
    chosen = last.candidates[0]
    # The earlier requests left their shared prefix cached where they went, and had all
    # finished: nothing was pending or running when the third one was decided.
    assert chosen.cached_tokens is not None and chosen.cached_tokens > 0
    assert chosen.cached_tokens == last.cached_tokens
    assert all(c.pending_prefill_tokens == 0 and c.batch_size == 0 for c in last.candidates)
    fields = last.to_stream_fields()
    assert DecisionRecord.from_stream_fields(fields) == last  # type: ignore[arg-type]  # str keys


def test_a_sampled_decision_is_copied_once_sent_from_the_indicators_it_was_made_on() -> None:
    """Copying a sampled decision's indicators is not on the request's way to the engine:
    it happens once the request is sent, before the dispatch is accounted, so the copy
    shows what the policy saw."""
    core = make_core(sampler=DecisionSampler(routine=(0.0, 3.0)))
    route(core, "shared prefix " * 40 + "warm")  # its prefix cached where it went
    assert core.runtime is not None
    intake = _intake(core, "shared prefix " * 40 + "question")
    plan = core.plan(core.runtime, intake, {}, time.perf_counter())
    seen = plan.arm.view
    pending = np.array(seen.pending_prefill, dtype=float)
    cached = seen.cached_tokens(plan.features).copy()
    assert plan.sampled is None  # nothing copied before the request is on its way
    plan.sent()
    assert plan.sampled is not None and plan.sampled.indicators is not None
    indicators = plan.sampled.indicators
    assert np.array_equal(indicators.pending_prefill_tokens, pending)
    assert np.array_equal(indicators.cached_tokens, cached) and cached.max() > 0
    slot = seen.ids.index(plan.instance)
    assert float(seen.pending_prefill[slot]) > pending[slot]  # the dispatch, accounted after


def test_a_retry_is_shipped_even_when_routine_sampling_is_exhausted() -> None:
    core = make_core(sampler=DecisionSampler(routine=(0.0, 0.0)))
    route(core, "plain request")
    assert shipped(core) == []
    plan = route(core, "this one fails on its first instance", fail_first=True)
    (record,) = shipped(core)
    # the retry was decided again, without the instance that failed
    assert record.attempts == 2 and record.tried == [plan.attempts[0].instance]
    assert record.instance == plan.instance == plan.decision.instance_id != record.tried[0]
    assert record.priority is True
    assert all(c.cached_tokens is None for c in record.candidates)  # not captured in time
    assert {c.instance for c in record.candidates} == {"i0", "i1", "i2"}


def test_a_retry_is_decided_again_without_the_instance_that_failed() -> None:
    # i1 and i2 each carry a request; the one routed to idle i0 fails there. Its load is
    # gone from i0, so least_load would pick i0 again: the lifecycle's rule leaves it out.
    core = make_core(policy="least_load")
    assert core.runtime is not None
    busy = []
    for prompt in ("one", "two"):
        plan = core.plan(core.runtime, _intake(core, prompt), {}, time.perf_counter())
        plan.sent()
        busy.append(plan.instance)
    plan = core.plan(core.runtime, _intake(core, "three"), {}, time.perf_counter())
    (idle,) = {"i0", "i1", "i2"} - set(busy)
    assert plan.instance == idle
    plan.sent()
    verdict = plan.attempt_failed("connect")
    assert verdict.retry and verdict.attempt is not None
    assert plan.instance in busy and plan.reason == "retry" and plan.tried == [idle]
    assert plan.decision is verdict.attempt.decision  # the retry's own decision


def test_a_finished_request_is_freed_by_reference_counting() -> None:
    """The plan is the request's lifecycle: nothing refers back to it, so once the request
    path and /admin/state's recent decisions let go of it, nothing of the request is left
    to the cyclic GC, which would free hundreds of requests at once in a pause of the
    event loop. A retried request too (its failure went through every observer)."""
    core = make_core()
    gc.collect()
    gc.disable()
    try:
        plan = route(core, "freed at once", fail_first=True)
        assert plan.attempt_count == 2
        gone = weakref.ref(plan)
        del plan
        for k in range(RECENT_DECISIONS):  # /admin/state's recent plans: pushed out
            route(core, f"request {k}")
        assert gone() is None
        assert gc.collect() == 0  # and no request left anything for the cyclic GC
    finally:
        gc.enable()


def test_a_request_failing_on_the_serving_side_is_shipped_with_its_status() -> None:
    core = make_core(sampler=DecisionSampler(routine=(0.0, 0.0)))
    assert core.runtime is not None
    plan = core.plan(core.runtime, _intake(core, "doomed"), {}, time.perf_counter())
    plan.sent()
    plan.attempt_failed("http_5xx", final=True)
    plan.done(status=502, ok=False, output_tokens=0, last_token_at=None, cached_tokens=0)
    (record,) = shipped(core)
    assert (record.status, record.attempts, record.priority) == (502, 1, True)


def test_canary_records_name_the_arm_and_only_its_instances() -> None:
    canary = {
        "id": 7,
        "assignment_key": "session",
        "arms": [
            {
                "name": "baseline",
                "weight": 50,
                "instances": ["i0", "i1"],
                "policy": {"kind": "round_robin"},
            },
            {
                "name": "candidate",
                "weight": 50,
                "instances": ["i2", "i3"],
                "policy": {"kind": "lmetric"},
            },
        ],
    }
    core = make_core(4, canary, DecisionSampler(routine=(0.0, 100.0)))
    for n in range(12):
        route(core, f"canary request {n}", session=f"s{n}")
    records = shipped(core)
    assert {r.arm for r in records} == {"baseline", "candidate"}
    for record in records:
        members = {"baseline": {"i0", "i1"}, "candidate": {"i2", "i3"}}[record.arm]
        assert record.canary == 7 and record.instance in members
        assert {c.instance for c in record.candidates} == members
        assert record.policy == {"baseline": "round_robin", "candidate": "lmetric"}[record.arm]


def test_large_clusters_are_cut_to_the_best_candidates_keeping_the_chosen_one() -> None:
    ids = tuple(f"i{k}" for k in range(40))
    scores = np.arange(40, dtype=float)
    scores[5] = np.inf  # filtered: listed after every scored candidate
    decision = Decision("i39", 39, "retry", 0, ids, scores)
    rows, total = candidate_rows(decision, ids, None, limit=8)
    assert total == 40 and len(rows) == 8
    assert [r.instance for r in rows[:7]] == ["i0", "i1", "i2", "i3", "i4", "i6", "i7"]
    assert rows[-1].instance == "i39"  # the chosen one, however bad its score


def test_the_unsent_buffer_is_bounded_and_keeps_the_newest() -> None:
    core = make_core(sampler=DecisionSampler(routine=(0.0, 1000.0)))
    plans = [route(core, f"request {n}") for n in range(DECISION_BUFFER + 5)]
    records = shipped(core)
    assert len(records) == DECISION_BUFFER and core.telemetry.decisions_dropped == 5
    assert records[-1].request_id == plans[-1].request_id


def test_a_router_ships_its_decisions_to_the_clusters_stream(
    fleet, router_factory, private_redis
) -> None:
    """Through a real router process and Redis: what the debug header tells one client
    is what the stream tells the live view."""
    router = router_factory(
        router_config(fleet, "lmetric", client_auth=debug_key_only()), redis_url=private_redis.url
    )
    client = redis.Redis(port=private_redis.port)
    try:
        headers = {"x-switchyard-debug": "1", "Authorization": f"Bearer {DEBUG_KEY}"}
        answers = []
        for n in range(3):  # within the routine burst: all three are sampled
            response = httpx.post(
                router.url + "/v1/completions",
                headers=headers,
                json={"model": MODEL, "prompt": f"decision stream {n} " * 30, "max_tokens": 2},
            )
            assert response.status_code == 200
            answers.append(response.headers)
        stream = contract.decisions_stream("test")
        wait_until(lambda: client.xlen(stream) >= 3, 10, "decisions in Redis")
        records = [DecisionRecord.from_stream_fields(f) for _, f in stream_entries(client, stream)]
        assert 0 < client.ttl(stream) <= contract.DECISIONS_STREAM_TTL_S
    finally:
        client.close()
    assert [r.request_id for r in records] == [h["x-switchyard-request-id"] for h in answers]
    for record, sent in zip(records, answers, strict=True):
        assert record.router == f"r{router.port}" and record.status == 200
        assert record.instance == sent["x-switchyard-instance"]
        assert record.reason == sent["x-switchyard-reason"]
        assert record.cached_tokens == int(sent["x-switchyard-cached-tokens"])
        assert {c.instance: c.score for c in record.candidates} == json.loads(
            sent["x-switchyard-scores"]
        )
        assert all(c.batch_size is not None for c in record.candidates)
    kept = router.state()["telemetry"]["decisions"]["kept"]
    assert kept["routine"] == 3


def test_decisions_made_while_redis_is_down_arrive_after_it_returns(
    fleet, router_factory, private_redis
) -> None:
    router = router_factory(router_config(fleet, "lmetric"), redis_url=private_redis.url)
    client = redis.Redis(port=private_redis.port)
    wait_until(
        lambda: client.get(contract.state_key("test", f"r{router.port}")) is not None,
        10,
        "the router writing to Redis",
    )
    client.close()
    private_redis.stop()
    sent = []
    for n in range(3):
        response = httpx.post(
            router.url + "/v1/completions",
            json={"model": MODEL, "prompt": f"during the outage {n}", "max_tokens": 2},
        )
        assert response.status_code == 200
        sent.append(response.headers["x-switchyard-request-id"])
    wait_until(lambda: router.state()["telemetry"]["redis"] is False, 5, "outage noticed")
    private_redis.start()  # empty: nothing was saved
    client = redis.Redis(port=private_redis.port)
    try:
        stream = contract.decisions_stream("test")
        wait_until(lambda: client.xlen(stream) >= 3, 10, "buffered decisions flushed")
        records = [DecisionRecord.from_stream_fields(f) for _, f in stream_entries(client, stream)]
    finally:
        client.close()
    assert [r.request_id for r in records] == sent
    assert router.state()["telemetry"]["decisions"]["dropped"] == 0
