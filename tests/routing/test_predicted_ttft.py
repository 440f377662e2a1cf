"""predicted_ttft: hand-computed predictions, what moves the choice, ties, parameters."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from router_worker.routing import (
    REGISTRY,
    ClusterState,
    GlobalTier,
    PolicyConfigError,
    make_policy,
    validate_params,
)
from router_worker.routing.policies.predicted_ttft import (
    COEFFICIENT_FIELDS,
    FALLBACK_COEFFICIENTS,
    PredictedTTFTParams,
    PredictedTTFTPolicy,
)

from .helpers import (
    add_decoding,
    add_decoding_context,
    add_pending,
    cluster,
    features,
    tokens,
    warm,
)

# Round numbers so every prediction below can be checked by hand.
SIMPLE: dict[str, Any] = {
    "prefill_tps": 1000.0,
    "step_overhead_s": 0.01,
    "decode_seq_s": 0.001,
    "attention_pair_s": 0.0,
    "min_step_s": 0.0,
    "chunk_tokens": 512,
}


def policy(seed: int = 0, **params) -> PredictedTTFTPolicy:
    built = make_policy("predicted_ttft", params, seed=seed)
    assert isinstance(built, PredictedTTFTPolicy)
    return built


def test_registered_last_with_a_description():
    assert list(REGISTRY)[-1] == "predicted_ttft"
    assert REGISTRY["predicted_ttft"] is PredictedTTFTPolicy
    assert "TTFT" in PredictedTTFTPolicy.description


def test_hand_computed_predictions():
    state = cluster(3)
    add_pending(state, "i1", 384)  # queued prefill; also one request in i1's batch
    add_decoding(state, "i2", 3)  # three running requests of one context token each
    request = features(tokens(0, 640))
    predicted = policy(**SIMPLE).predict(request, state.view())
    # i0 idle: 640 tokens in ceil(640/512) = 2 steps of 10 ms, plus 640 tokens at 1000/s
    assert predicted[0] == pytest.approx(2 * 0.01 + 0.640)
    # i1: 1024 tokens, budget 512 − 1 = 511 per step (the running request takes one) → 3
    # steps of 10 + 1 ms; plus half a step's wait for the step in progress
    assert predicted[1] == pytest.approx(0.5 * 0.011 + 3 * 0.011 + 1.024)
    # i2: 640 tokens, budget 509 → 2 steps of 10 + 3 ms, plus half a step's wait
    assert predicted[2] == pytest.approx(0.5 * 0.013 + 2 * 0.013 + 0.640)


def test_hand_computed_with_a_global_tier():
    """Tokens the tier holds beyond the local hit load at tier_token_cost of a prefilled
    token and then count as cached for attention."""
    tier = GlobalTier()
    state = ClusterState(default_prefill_tps=1000.0, global_tier=tier)
    state.add_instance("i0")
    prompt = tokens(0, 640)
    tier.insert(features(prompt[:320]).block_hashes)  # 20 blocks in the tier
    request = features(prompt)
    params = {**SIMPLE, "attention_pair_s": 1e-6, "tier_token_cost": 0.1}
    # 320 loaded (work 32) + 320 prefilled after 320 "cached": 352 tokens in one step
    attention = 1e-6 * (320 * 320 + 0.5 * 320 * 320)
    assert policy(**params).predict(request, state.view())[0] == pytest.approx(
        0.01 + 0.352 + attention
    )
    blind = {**params, "tier_token_cost": None}
    assert policy(**blind).predict(request, state.view())[0] == pytest.approx(
        2 * 0.01 + 0.640 + 1e-6 * 0.5 * 640 * 640
    )


def test_hand_computed_attention_and_memory_floor():
    state = cluster(3)
    prompt = tokens(0, 640)
    warm(state, "i0", prompt[:320])  # 20 blocks cached: 320 new tokens after 320
    add_decoding(state, "i2", 2)  # contexts of 1 token each: 2 pairs a step
    request = features(prompt)
    params = {**SIMPLE, "attention_pair_s": 1e-6, "chunk_tokens": 8192}
    predicted = policy(**params).predict(request, state.view())
    assert predicted[0] == pytest.approx(0.01 + 0.320 + 1e-6 * (320 * 320 + 320 * 320 / 2))
    assert predicted[1] == pytest.approx(0.01 + 0.640 + 1e-6 * 640 * 640 / 2)
    step = 0.01 + 2 * 0.001 + 2 * 1e-6
    assert predicted[2] == pytest.approx(0.5 * step + step + 0.640 + 1e-6 * 640 * 640 / 2)
    # the floor: no step is shorter than min_step_s, however little it computes
    tiny = features(tokens(10_000, 16))
    floored = policy(**{**SIMPLE, "min_step_s": 0.05}).predict(tiny, state.view())
    assert floored[1] == pytest.approx(0.05)  # idle: 10 + 16 ms of work < one 50 ms step
    assert floored[2] == pytest.approx(0.5 * 0.05 + 0.05)  # busy: half a step's wait too


def test_the_prompts_queued_ahead_are_charged_their_attention():
    """r waits for the queue's whole prefill, its attention included: behind a 640-token
    prompt still prefilling on i0 (r's prefix, in i0's shadow), r's 16 new tokens cost
    little, but the queued prompt's 640²/2 pairs are ahead of them."""
    state = cluster(2)
    prompt = tokens(0, 640)
    state.on_dispatch(features(prompt), "i0", 0.0)
    request = features(np.concatenate([prompt, tokens(9_000, 16)]))
    params = {**SIMPLE, "attention_pair_s": 1e-6, "chunk_tokens": 8192}
    predicted = policy(**params).predict(request, state.view())
    step = 0.01 + 0.001  # i0's batch holds the prefilling request
    queued = 1e-6 * 640 * 640 / 2
    own = 1e-6 * (16 * 640 + 16 * 16 / 2)
    assert predicted[0] == pytest.approx(0.5 * step + step + 0.656 + queued + own)
    assert predicted[1] == pytest.approx(0.01 + 0.656 + 1e-6 * 656 * 656 / 2)
    blind = policy(**params, queue_attention=False).predict(request, state.view())
    assert blind[0] == pytest.approx(predicted[0] - queued)


def test_decision_carries_the_chosen_prediction_and_reason():
    state = cluster(2)
    add_pending(state, "i0", 1000)
    decision = policy(**SIMPLE).decide(features(tokens(0, 640)), state.view(), 0.0)
    assert (decision.instance_id, decision.reason) == ("i1", "predicted_ttft")
    assert decision.details["predicted_ttft_s"] == pytest.approx(0.66)
    assert decision.score_table()["i1"] == pytest.approx(0.66)
    assert decision.score_table()["i0"] == pytest.approx(0.5 * 0.011 + 4 * 0.011 + 1.64)


def _prefer_hit_despite(batch: int) -> str:
    """i0 holds 64 of the prompt's 640 tokens and runs ``batch`` requests; i1 is idle."""
    state = cluster(2)
    prompt = tokens(0, 640)
    warm(state, "i0", prompt[:64])
    add_decoding(state, "i0", batch)
    return policy().decide(features(prompt), state.view(), 0.0).instance_id


def test_a_big_batch_outweighs_a_small_cache_hit_with_the_h20_defaults():
    # On an H20 a running request costs each step about what one more prefill token does:
    # 4 of them cost less than the 64 hit tokens save, 64 of them more (≈ 142 vs 132 ms).
    assert _prefer_hit_despite(4) == "i0"
    assert _prefer_hit_despite(64) == "i1"


@pytest.mark.parametrize(("queued", "chosen"), [(100, "i0"), (2000, "i1")])
def test_a_long_queue_outweighs_a_full_cache_hit(queued, chosen):
    state = cluster(2)
    prompt = tokens(0, 640)
    warm(state, "i0", prompt)
    add_pending(state, "i0", queued)
    assert policy().decide(features(prompt), state.view(), 0.0).instance_id == chosen


def test_with_equal_queues_the_cache_hit_wins():
    state = cluster(3)
    prompt = tokens(0, 1024)
    for instance in ("i0", "i1", "i2"):
        add_pending(state, instance, 3000)
    warm(state, "i2", prompt)
    for seed in range(10):
        decision = policy(seed).decide(features(prompt), state.view(), 0.0)
        assert decision.instance_id == "i2"


def test_equal_predictions_fall_to_lower_p_token_then_lower_batch_size():
    state = cluster(2)
    prompt = tokens(0, 640)
    warm(state, "i0", prompt)
    add_decoding(state, "i0", 2)
    add_decoding(state, "i1", 1)
    floor_bound = {**SIMPLE, "min_step_s": 1.0, "chunk_tokens": 8192}  # both predict 1.5 s
    for seed in range(10):
        decision = policy(seed, **floor_bound).decide(features(prompt), state.view(), 0.0)
        assert decision.score_table() == pytest.approx({"i0": 1.5, "i1": 1.5})
        assert decision.instance_id == "i0"  # P-token 1 against 640, before BS 2 against 1
    state = cluster(2)
    add_decoding(state, "i0", 2)
    batch_blind = {**SIMPLE, "step_overhead_s": 0.0, "decode_seq_s": 0.0}
    for seed in range(10):
        decision = policy(seed, **batch_blind).decide(features(prompt), state.view(), 0.0)
        assert decision.instance_id == "i1"  # same prediction and P-token; BS 0 against 2


def test_exact_ties_go_to_seeded_random():
    state = cluster(3)
    request = features(tokens(0, 640))
    chosen = {policy(seed).decide(request, state.view(), 0.0).instance_id for seed in range(30)}
    assert chosen == {"i0", "i1", "i2"}


def test_measured_prefill_throughput_is_used_only_when_asked():
    state = cluster(2, tps=2000.0)
    slow = features(tokens(50_000, 1000))
    state.on_dispatch(slow, "i0", 0.0, cached_tokens=0)
    state.on_first_token(slow.request_id, 2.0)  # 1000 tokens in 2 s: EWMA 0.8·2000 + 0.2·500
    state.on_finish(slow.request_id, 2.5)  # i0 is idle again
    request = features(tokens(0, 640))
    measured = policy(**SIMPLE, use_measured_prefill_tps=True)
    predicted = measured.predict(request, state.view())
    assert predicted.tolist() == pytest.approx([0.02 + 640 / 1700, 0.02 + 640 / 2000])
    assert measured.decide(request, state.view(), 3.0).instance_id == "i1"
    modelled = policy(**SIMPLE).predict(request, state.view())
    assert modelled.tolist() == pytest.approx([0.66, 0.66])  # the view's rate is ignored


def test_unset_coefficients_fall_back_to_the_h20_qwen2_7b_values():
    params = validate_params("predicted_ttft", {})
    assert isinstance(params, PredictedTTFTParams)
    assert params.prefill_tps is None  # None = "derive it"
    assert set(COEFFICIENT_FIELDS) == set(FALLBACK_COEFFICIENTS)
    defaults = policy().coefficients
    assert {name: getattr(defaults, name) for name in COEFFICIENT_FIELDS} == FALLBACK_COEFFICIENTS
    partial = policy(prefill_tps=1234.0, chunk_tokens=2048).coefficients
    assert (partial.prefill_tps, partial.chunk_tokens) == (1234.0, 2048)
    assert partial.step_overhead_s == FALLBACK_COEFFICIENTS["step_overhead_s"]


def test_every_parameter_is_described_for_operators():
    schema = PredictedTTFTPolicy.Params.model_json_schema()
    assert all(prop.get("description") for prop in schema["properties"].values())
    others = {
        "use_measured_prefill_tps",
        "tier_token_cost",
        "decode_slack",
        "decode_weight",
        "output_tokens_prior",
        "correction",
        "kv_pressure",
        "queue_attention",
        "hotspot",
    }
    assert set(COEFFICIENT_FIELDS) | others == set(schema["properties"])


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"prefill_tps": 0}, "prefill_tps"),
        ({"prefill_tps": "fast"}, "prefill_tps"),
        ({"step_overhead_s": -0.001}, "step_overhead_s"),
        ({"decode_seq_s": -1}, "decode_seq_s"),
        ({"attention_pair_s": -1e-9}, "attention_pair_s"),
        ({"min_step_s": -1}, "min_step_s"),
        ({"chunk_tokens": 0}, "chunk_tokens"),
        ({"chunk_tokens": 81.5}, "chunk_tokens"),
        ({"use_measured_prefill_tps": "sometimes"}, "use_measured_prefill_tps"),
        ({"batch_offset": 1}, "batch_offset"),  # unknown parameters are refused
    ],
)
def test_invalid_params_name_the_field(params, field):
    with pytest.raises(PolicyConfigError) as info:
        make_policy("predicted_ttft", params)
    assert info.value.field == field and f"predicted_ttft.{field}" in str(info.value)


# ----- the decode guard, admission behind a full KV cache, the learned errors ----------
def test_the_decode_guard_moves_a_cache_hit_off_an_instance_whose_decode_piles_up():
    """i0 holds the prompt but decodes 64 requests of 20k-token contexts: its decode step
    is many times the idle i1's, over the expected output that outweighs the prefill."""
    state = cluster(2, capacity_blocks=200_000)
    prompt = tokens(0, 2048)
    warm(state, "i0", prompt)
    add_decoding_context(state, "i0", 64, 20_000)
    assert state.view().cached_tokens(features(prompt))[0] == 2047
    request = features(prompt)
    guarded = policy().decide(request, state.view(), 0.0)
    assert guarded.instance_id == "i1"
    assert guarded.details["predicted_tpot_s"] < policy().decode_step(request, state.view())[0]
    blind = policy(decode_slack=None).decide(request, state.view(), 0.0)
    assert blind.instance_id == "i0"  # what it did before: the hit wins on TTFT


def test_a_small_decode_difference_leaves_the_cache_hit_where_it_is():
    state = cluster(2)
    prompt = tokens(0, 2048)
    warm(state, "i0", prompt)
    add_decoding_context(state, "i0", 2, 2_000)
    assert policy().decide(features(prompt), state.view(), 0.0).instance_id == "i0"


def test_requests_queued_behind_a_full_kv_cache_wait_to_be_admitted():
    state = cluster(2)
    for instance in ("i0", "i1"):
        add_decoding(state, instance, 4)
        add_pending(state, instance, 16)
    # both engines report one waiting request (ours); only i0's cache is full
    state.on_scrape("i0", 1.0, running=4, waiting=1, kv_usage=0.99)
    state.on_scrape("i1", 1.0, running=4, waiting=1, kv_usage=0.50)
    built = policy(**SIMPLE)
    view = state.view()
    step = built.decode_step(features(tokens(0, 64)), view)
    wait = built.admission_wait(view, step)
    # i0: our queued request and r itself, each admitted as one of 4 running ones finishes
    assert wait[0] == pytest.approx(2 * 256 * step[0] / 4)
    assert wait[1] == 0.0


def test_each_instance_learns_its_ttft_line_and_it_fades_to_the_fleets():
    """i0 is a slow engine with an overhead (measured = 0.3 + 2 × predicted), i1 is as
    modelled but for a 20 ms overhead: each instance's fit leans toward its own line, held
    back by the ridge toward the fleet's (a conservative correction measured best)."""
    errors = policy(**SIMPLE).errors
    for k in range(80):
        predicted, now = 0.1 + 0.025 * k, 0.5 * k
        errors.predicted(f"a{k}", "i0", predicted, 0.01, now=now)
        errors.first_token(f"a{k}", "i0", now=now + 0.3 + 2 * predicted)
        errors.predicted(f"b{k}", "i1", predicted, 0.01, now=now)
        errors.first_token(f"b{k}", "i1", now=now + 0.02 + predicted)
    intercept, slope, ratio = errors.corrections(("i0", "i1", "new"), now=40.0)
    corrected = intercept + slope * 1.0  # what each would make of a 1 s prediction
    # i1 leans toward the fleet's line, which i0's slowness moved: the gap is what steers
    assert corrected[0] > corrected[1] + 0.3 and 1.0 < corrected[1] < 1.2
    assert slope[0] > 1.15 and slope[1] == pytest.approx(1.0, abs=0.1)
    assert list(ratio) == [1.0, 1.0, 1.0]  # no finish yet: decode uncorrected
    # an instance never heard from is judged by the fleet's line, between the two
    assert slope[1] < slope[2] < slope[0]
    # ten time constants without a sample: i0 is judged like the fleet again
    _, later_slope, _ = errors.corrections(("i0", "new"), now=40.0 + 300.0)
    assert later_slope[0] == pytest.approx(later_slope[1], rel=0.01)
    # a first token of an attempt on another instance teaches nothing
    errors.predicted("c", "i1", 0.5, 0.01, now=340.0)
    errors.first_token("c", "i0", now=400.0)
    assert errors.corrections(("i0",), now=340.0)[1][0] == pytest.approx(later_slope[0])


def test_the_decode_ratio_and_the_expected_output_come_from_finishes():
    errors = policy(**SIMPLE).errors
    assert errors.output_tokens == 256  # the prior
    for k in range(30):  # i0 decodes at twice its predicted step, 101 tokens each
        errors.predicted(f"r{k}", "i0", 0.1, 0.01, now=0.0)
        errors.first_token(f"r{k}", "i0", now=0.1)
        errors.finish(f"r{k}", "i0", 101, now=0.1 + 100 * 0.02)
    _, _, ratio = errors.corrections(("i0", "i1"), now=2.1)
    # i0 near its own 2×; i1, never heard from, at the fleet's (which i0 moved a little)
    assert ratio[0] == pytest.approx(2.0, rel=0.06) and 1.0 < ratio[1] < 1.5
    assert errors.output_tokens == pytest.approx(101)
    # one wild sample moves the ratio by a bounded amount
    errors.predicted("wild", "i0", 0.1, 1e-9, now=2.1)
    errors.first_token("wild", "i0", now=2.2)
    errors.finish("wild", "i0", 3, now=100.0)
    _, _, after = errors.corrections(("i0",), now=100.0)
    assert after[0] <= ratio[0] * 8.0**0.1 * 1.01


def test_a_learned_slowness_steers_requests_away_from_that_instance():
    state = cluster(2)
    request = features(tokens(0, 640))

    def chosen(correction: bool) -> set[str]:
        picks = set()
        for seed in range(20):
            built = policy(seed, **SIMPLE, correction=correction)
            for k in range(10):  # i0 answered 2.3 s later than predicted, ten times
                built.errors.predicted(f"s{k}", "i0", 0.7, 0.01, now=0.0)
                built.errors.first_token(f"s{k}", "i0", now=3.0)
            picks.add(built.decide(request, state.view(), 3.0).instance_id)
        return picks

    assert chosen(correction=True) == {"i1"}
    assert chosen(correction=False) == {"i0", "i1"}  # identical idle instances: a tie
