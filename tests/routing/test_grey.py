"""Grey-failure detection (router_worker/routing/grey.py) on a fleet of hand-driven
instances: each second every instance is offered one request unless the detector excludes
it, and its TTFT and TPOT are its speed factor times a seeded lognormal jitter; then
through the request lifecycle, where the expected TPOT is the cost model's step for the
batch the request decoded in."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from router_worker.routing import ClusterState, RequestLifecycle
from router_worker.routing.grey import GreyDetector, GreyParams, GreyState, GreyTransition
from router_worker.routing.policies.round_robin import RoundRobinPolicy
from router_worker.routing.step_cost import (
    REFERENCE_DECODE_STEP,
    REFERENCE_PREFILL,
    decode_step_s,
    prefill_s,
)
from tests.routing.helpers import add_decoding_context, cluster, features, tokens

Speeds = Callable[[float], list[float]]  # each instance's slowness factor at time t


def drive(
    detector: GreyDetector,
    speeds: Speeds,
    start: float,
    end: float,
    seed: int = 0,
    jitter_sigma: float = 0.15,
) -> tuple[list[GreyTransition], list[int]]:
    """Offer one request per instance per second from ``start`` to ``end``; returns the
    transitions and how many requests each instance took."""
    rng = np.random.default_rng(seed)
    size = len(speeds(start))
    ids = tuple(f"i{k}" for k in range(size))
    taken = [0] * size
    transitions: list[GreyTransition] = []
    for t in np.arange(start, end, 1.0):
        now = float(t)
        out = set(detector.excluded(ids, now))
        factors = speeds(now)
        for slot, name in enumerate(ids):
            if slot in out:
                continue
            taken[slot] += 1
            jitter = rng.lognormal(0.0, jitter_sigma, size=2)
            detector.observe(name, "ttft", 0.2 * factors[slot] * jitter[0], 0.1, now)
            detector.observe(name, "tpot", 0.03 * factors[slot] * jitter[1], 1.0, now + 0.5)
        transitions += detector.take_transitions()
    return transitions, taken


def test_heterogeneous_fleet_is_never_flagged_over_an_hour():
    # Mixed GPUs: half the fleet 1.5x and 2x slower than the cost model, all along.
    speeds = [1.0] * 8 + [1.5] * 4 + [2.0] * 4
    transitions, _ = drive(GreyDetector(), lambda t: speeds, 0, 3600)
    assert transitions == []


def test_fleet_wide_slowdown_flags_nobody():
    detector = GreyDetector()
    transitions, _ = drive(detector, lambda t: [1.0 if t < 300 else 2.5] * 8, 0, 900)
    assert transitions == []


def test_slowed_instance_is_degraded_drained_probed_and_restored():
    detector = GreyDetector()

    def speeds(t: float) -> list[float]:
        slow = 3.0 if 300 <= t < 600 else 1.0
        return [slow] + [1.0] * 7

    drive(detector, speeds, 0, 300)
    transitions, taken = drive(detector, speeds, 300, 360)
    states = [(x.after, x.at - 300) for x in transitions if x.instance == "i0"]
    assert [s for s, _ in states] == [GreyState.SUSPECT, GreyState.DEGRADED, GreyState.DRAINED]
    assert states[0][1] <= 30  # detected within 30 s at 1 req/s
    assert all(x.instance == "i0" for x in transitions)  # no other instance flagged
    assert taken[0] < taken[1] / 2  # its share went down
    # Drained: only probes reach it, each judged alone; still slow, it stays drained.
    _, taken = drive(detector, speeds, 360, 600)
    assert detector.state_of("i0") is GreyState.DRAINED
    assert 0 < taken[0] <= 240 / GreyParams().probe_interval_s + 1
    # Fast again: good probes restore it, and it takes its full share.
    transitions, _ = drive(detector, speeds, 600, 660)
    assert [(x.after, x.cause) for x in transitions] == [(GreyState.HEALTHY, "probes_good")]
    _, taken = drive(detector, speeds, 660, 720)
    assert taken[0] == taken[1] == 60


def test_hysteresis_keeps_a_degraded_instance_until_it_is_clearly_back():
    params = GreyParams(drain_after_s=3600)
    detector = GreyDetector(params)
    level = {"i0": 3.0}

    def speeds(t: float) -> list[float]:
        return [level["i0"] if t >= 200 else 1.0] + [1.0] * 7

    drive(detector, speeds, 0, 260, jitter_sigma=0.05)
    assert detector.state_of("i0") is GreyState.DEGRADED
    level["i0"] = 1.4  # between the exit (1.25) and enter (1.6) ratios: no flapping
    transitions, _ = drive(detector, speeds, 260, 500, jitter_sigma=0.05)
    assert transitions == [] and detector.state_of("i0") is GreyState.DEGRADED
    level["i0"] = 1.0
    transitions, _ = drive(detector, speeds, 500, 600)
    assert [x.after for x in transitions] == [GreyState.HEALTHY]


def test_operator_override_wins():
    detector = GreyDetector()

    def speeds(t: float) -> list[float]:
        return [3.0 if t >= 200 else 1.0] + [1.0] * 3

    drive(detector, speeds, 0, 100)
    detector.override("i0", "healthy", 100)
    transitions, taken = drive(detector, speeds, 100, 400)
    assert transitions == [] and taken[0] == 300
    detector.override("i1", "drained", 400)
    assert [(x.instance, x.after, x.cause) for x in detector.take_transitions()] == [
        ("i1", GreyState.DRAINED, "operator")
    ]
    _, taken = drive(detector, speeds, 400, 500)
    assert taken[1] == 0  # no probes for an operator's drain
    detector.override("i1", "auto", 500)
    assert detector.state_of("i1") is GreyState.HEALTHY
    with pytest.raises(ValueError, match="override must be one of"):
        detector.override("i1", "maybe", 500)
    with pytest.raises(ValueError, match="signal must be one of"):
        detector.observe("i1", "latency", 1.0, 1.0, 500)


# ----- through the request lifecycle: the cost model's expectation ------------------------
def _lifecycle_run(
    params: GreyParams, output_tokens: int, loaded_at: float, slow_at: float = math.inf
) -> tuple[ClusterState, list[GreyTransition]]:
    """Four instances (mixed speeds) under round robin, one request at a time, each
    decoding at the cost model's step for the batch it runs in × its instance's speed ×
    jitter, as enginesim's engines do; from ``loaded_at`` i0 also carries 60 long requests
    (a prefix's holder under a cache-aware policy); from ``slow_at`` i1 runs 3x slower."""
    state = cluster(4)
    state.grey = GreyDetector(params)
    policy = RoundRobinPolicy(seed=1)
    rng = np.random.default_rng(7)
    speeds = [1.0, 1.0, 1.5, 2.0]
    transitions: list[GreyTransition] = []
    for tick in range(600):
        t = 2.0 * tick
        if t == loaded_at:
            add_decoding_context(state, "i0", 60, 2000)
        for k in range(4):
            now = t + 0.5 * k
            life = RequestLifecycle(features(tokens(100_000 * (4 * tick + k), 64)), policy, state)
            slot = state.slot_of(life.route(state.view(), now).instance)
            life.dispatch(now)
            life.first_token(now + 0.01, ttft=0.01)
            view = state.view()
            step = decode_step_s(
                float(view.batch_size[slot]),
                float(view.decode_context_tokens[slot]),
                **REFERENCE_DECODE_STEP,
            )
            slowed = 3.0 if slot == 1 and now >= slow_at else 1.0
            tpot = step * speeds[slot] * slowed * rng.lognormal(0.0, 0.1)
            life.finish(now + 0.01 + tpot * (output_tokens - 1), output_tokens)
        transitions += state.grey.take_transitions()
    return state, transitions


def test_an_instance_busier_than_the_others_is_expected_to_be_slower():
    _, transitions = _lifecycle_run(GreyParams(), 64, loaded_at=300.0)
    assert transitions == []
    # Against a constant (the expectation before the cost model) the busy one is flagged.
    constant = GreyParams(decode_seq_s=0.0, context_token_s=0.0)
    _, transitions = _lifecycle_run(constant, 64, loaded_at=300.0)
    assert ("i0", GreyState.DRAINED) in [(x.instance, x.after) for x in transitions]


def test_a_slowed_instance_is_found_through_the_lifecycle():
    _, transitions = _lifecycle_run(GreyParams(), 64, loaded_at=300.0, slow_at=600.0)
    flagged = [(x.instance, x.after) for x in transitions]
    assert ("i1", GreyState.DRAINED) in flagged and {x.instance for x in transitions} == {"i1"}
    degraded = next(x.at for x in transitions if x.after is GreyState.DEGRADED)
    assert 600 < degraded <= 630


def test_a_decode_too_short_to_measure_is_not_judged():
    # 4 tokens at ~6 ms a step: 18 ms of decode, under min_decode_s (the router's jitter).
    state, transitions = _lifecycle_run(GreyParams(), 4, loaded_at=-1.0, slow_at=600.0)
    assert transitions == [] and state.grey is not None
    assert state.grey.excess_of("i1") == 1.0  # never judged: no sample at all


# ----- prefill interleaved with a decode (chunked prefill) ---------------------------------
def _burst_run(
    params: GreyParams,
    burst: tuple[float, float],
    slow_at: float = math.inf,
    prompts: tuple[int, int] = (2, 1500),
    late: bool = False,
    share: float = 1.0,
    output_tokens: int = 64,
) -> list[GreyTransition]:
    """Four instances (mixed speeds) under round robin, one request a second, each
    decoding ``output_tokens`` - 1 steps at the cost model's step × its instance's speed ×
    jitter. During ``burst`` i0 also takes ``prompts`` (how many, how long; answered in
    one token) while each of its requests decodes: their prefill chunks run in the same
    engine steps, so that request's decode lasts their prefill longer, here 1.3× what the
    cost model's prefill coefficients say (an engine is never exactly the model).
    ``late``: the prompts' first tokens reach the router after the request's last one:
    just after (they came out of the same step), or, with ``share`` < 1, when the rest of
    their prefill is done (only that share of it ran in the request's decode steps). From
    ``slow_at`` i0 runs 3× slower, prefill and decode alike."""
    state = cluster(4)
    state.grey = GreyDetector(params)
    policy = RoundRobinPolicy(seed=1)
    rng = np.random.default_rng(11)
    speeds = [1.0, 1.0, 1.5, 2.0]
    count, prompt = prompts
    transitions: list[GreyTransition] = []
    for tick in range(300):
        for k in range(4):
            now = 4.0 * tick + k
            life = RequestLifecycle(features(tokens(100_000 * (4 * tick + k), 64)), policy, state)
            slot = state.slot_of(life.route(state.view(), now).instance)
            life.dispatch(now)
            life.first_token(now + 0.01, ttft=0.01)
            slowed = 3.0 if slot == 0 and now >= slow_at else 1.0
            interleaved, others = 0.0, []
            if slot == 0 and burst[0] <= now < burst[1]:
                for j in range(count):
                    start = 900_000_000 + 100_000 * (4 * count * tick + count * k + j)
                    other = features(tokens(start, prompt))
                    state.on_dispatch(other, "i0", now + 0.02, cached_tokens=0)
                    others.append(other.request_id)
                    prefill = 1.3 * prefill_s(
                        float(prompt), 0.5 * prompt * prompt, **_prefill_coefficients()
                    )
                    interleaved += prefill * slowed
                    if not late:
                        state.on_first_token(other.request_id, now + 0.02 + interleaved)
                        state.on_finish(other.request_id, now + 0.02 + interleaved)
            view = state.view()
            step = decode_step_s(
                float(view.batch_size[slot]),
                float(view.decode_context_tokens[slot]),
                **REFERENCE_DECODE_STEP,
            )
            decode = step * speeds[slot] * slowed * rng.lognormal(0.0, 0.1) * (output_tokens - 1)
            end = now + 0.01 + decode + share * interleaved
            life.finish(end, output_tokens)
            for request_id in others if late else ():
                prefilled = max(end, now + 0.02 + interleaved)
                state.on_first_token(request_id, prefilled)
                state.on_finish(request_id, prefilled)
        transitions += state.grey.take_transitions()
    return transitions


def _prefill_coefficients() -> dict[str, float]:
    return {
        "prefill_token_s": 1.0 / REFERENCE_PREFILL["prefill_tps"],
        "attention_pair_s": REFERENCE_PREFILL["attention_pair_s"],
    }


def test_prompts_prefilled_during_a_decode_are_expected_to_slow_it():
    # i0's decodes last about twice the decode steps while it takes the burst: healthy.
    assert _burst_run(GreyParams(), burst=(200.0, 800.0)) == []
    # The decode-only expectation (before the prefill was counted) drains the healthy i0.
    decode_only = GreyParams(prefill_token_s=0.0, attention_pair_s=0.0)
    flagged = [(x.instance, x.after) for x in _burst_run(decode_only, burst=(200.0, 800.0))]
    assert ("i0", GreyState.DRAINED) in flagged


def test_a_long_prompt_whose_first_token_comes_after_the_decode_is_counted():
    # One 12,000-token prompt per decode on i0, its chunks filling the decode's steps (it
    # lasts about 6x its decode steps); its first token reaches the router only after the
    # decode's last, so the prompts completed in between are none: the prompt being
    # prefilled counts at the model's rate since it started.
    assert _burst_run(GreyParams(), burst=(200.0, 800.0), prompts=(1, 12_000), late=True) == []


def test_an_instance_slowed_while_it_takes_a_burst_is_still_found():
    transitions = _burst_run(GreyParams(), burst=(200.0, 1200.0), slow_at=600.0)
    assert {x.instance for x in transitions} == {"i0"}
    degraded = next(x.at for x in transitions if x.after is GreyState.DEGRADED)
    assert 600 < degraded <= 640
    assert GreyState.DRAINED in [x.after for x in transitions]


def test_a_slowed_instance_is_not_credited_prefill_it_did_not_do():
    # Short decodes (15 steps) on i0, each sharing its steps with a 4,000-token prompt
    # whose first token comes later (30% of its prefill ran in them): the share credited
    # is measured on the instance (from its first token), so a slowed i0 is no healthy one
    # with more prefill. At the model's rate instead, the whole prompt's work was credited
    # and the 3x slowed i0 looked 1.4x its normal: never flagged.
    def run(slow_at: float) -> list[GreyTransition]:
        return _burst_run(
            GreyParams(),
            burst=(0.0, 1200.0),
            slow_at=slow_at,
            prompts=(1, 4000),
            late=True,
            share=0.3,
            output_tokens=16,
        )

    assert run(math.inf) == []
    transitions = run(600.0)
    assert {x.instance for x in transitions} == {"i0"}
    degraded = next(x.at for x in transitions if x.after is GreyState.DEGRADED)
    assert 600 < degraded <= 640
