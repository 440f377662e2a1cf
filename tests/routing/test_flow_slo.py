"""A request's own SLOs (x-slo-ttft-ms, x-slo-tpot-ms, carried on RequestFeatures) reach
the SLO-aware policies: SMetric holds a follow-up to the request's TTFT SLO, predicted TTFT
keeps to instances predicted to meet both."""

from __future__ import annotations

import dataclasses

import numpy as np

from router_worker.routing import make_policy

from .helpers import add_decoding, add_pending, cluster, features, tokens, warm
from .test_predicted_ttft import SIMPLE

HISTORY = tokens(0, 2048)


def test_smetric_holds_a_follow_up_to_the_requests_own_ttft_slo():
    state = cluster(3, tps=10_000)
    warm(state, "i2", HISTORY)
    add_pending(state, "i2", 2_800)  # 0.28 s of queue: within the policy's 0.31 s SLO
    request = features(np.concatenate([HISTORY, tokens(50_000, 64)]), turn_index=3)
    policy = make_policy("smetric")
    assert policy.decide(request, state.view(), 0.0).instance_id == "i2"
    strict = dataclasses.replace(request, slo_ttft_s=0.05)
    decision = make_policy("smetric").decide(strict, state.view(), 0.0)
    assert decision.reason == "session_migrate" and decision.instance_id != "i2"
    assert decision.details["slo_s"] == 0.05


def _fast_prefill_slow_decode():
    state = cluster(2, tps=1000.0)
    add_decoding(state, "i0", 50)  # a big batch: 60 ms decode steps, but no prefill queue
    add_pending(state, "i1", 384)  # a short batch, some queued prefill
    return state


def test_predicted_ttft_keeps_to_instances_meeting_the_requests_tpot_slo():
    state = _fast_prefill_slow_decode()
    request = features(tokens(0, 640))
    policy = make_policy("predicted_ttft", {**SIMPLE, "decode_slack": None})
    plain = policy.decide(request, state.view(), 0.0)
    assert plain.instance_id == "i0" and "slo_met" not in plain.details
    with_slo = dataclasses.replace(request, slo_tpot_s=0.02)
    decision = make_policy("predicted_ttft", {**SIMPLE, "decode_slack": None}).decide(
        with_slo, state.view(), 0.0
    )
    assert decision.instance_id == "i1" and decision.details["slo_met"] is True
    assert decision.details["predicted_tpot_s"] <= 0.02


def test_predicted_ttft_says_when_no_instance_can_meet_the_slo():
    state = _fast_prefill_slow_decode()
    request = dataclasses.replace(features(tokens(0, 640)), slo_ttft_s=0.01)
    decision = make_policy("predicted_ttft", {**SIMPLE, "decode_slack": None}).decide(
        request, state.view(), 0.0
    )
    assert decision.instance_id == "i0"  # the least miss
    assert decision.details["slo_met"] is False and decision.details["slo_ttft_s"] == 0.01
