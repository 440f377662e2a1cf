import pytest

from router_worker.routing import Health, make_policy

from .helpers import add_decoding, add_pending, cluster, features, tokens, warm


def test_round_robin_cycles_over_healthy_instances():
    state = cluster(4)
    state.set_health("i2", Health.DRAINING)
    policy = make_policy("round_robin", seed=0)
    picks = [
        policy.decide(features(tokens(0, 20)), state.view(), 0.0).instance_id for _ in range(6)
    ]
    start = picks.index("i0")
    assert picks[start : start + 3] == ["i0", "i1", "i3"]
    assert picks[:3] == picks[3:]


def test_least_load_prefers_fewer_in_flight_then_less_pending():
    state = cluster(3)
    add_decoding(state, "i0", 1)
    add_pending(state, "i1", 500)
    add_pending(state, "i2", 100)
    add_pending(state, "i2", 100)
    decision = make_policy("least_load").decide(features(tokens(0, 20)), state.view(), 0.0)
    assert decision.instance_id == "i0"  # 1 in flight, 0 pending; i1 also 1 but 500 pending


def test_linear_weighted_sum_normalises_both_indicators():
    state = cluster(2)
    add_pending(state, "i0", 900)  # P0 = 1000, BS0 = 1 (the 900-token prefill is running)
    add_decoding(state, "i1", 4)  # P1 = 100,  BS1 = 4
    request = features(tokens(0, 100))
    chat = make_policy("linear", {"w": 0.7}).decide(request, state.view(), 0.0)
    assert chat.score_table() == pytest.approx({"i0": 0.7 + 0.3 * 0.25, "i1": 0.7 * 0.1 + 0.3})
    assert chat.instance_id == "i1"
    decode_heavy = make_policy("linear", {"w": 0.2}).decide(request, state.view(), 0.0)
    assert decode_heavy.instance_id == "i0"  # 0.2 + 0.8 · 0.25 vs 0.02 + 0.8


def test_linear_ties_fall_to_lower_p_token_then_lower_bs():
    state = cluster(2)
    add_decoding(state, "i0", 2)
    add_decoding(state, "i1", 1)
    request = features(tokens(0, 100))
    decision = make_policy("linear", {"w": 1.0}).decide(request, state.view(), 0.0)
    assert decision.score_table()["i0"] == decision.score_table()["i1"]
    assert decision.instance_id == "i1"


def test_linear_dynamo_variant_counts_blocks():
    state = cluster(2)
    prompt = tokens(0, 320)
    warm(state, "i0", prompt)
    add_decoding(state, "i0", 3)  # three 1-token contexts: 3 decode blocks
    decision = make_policy("linear", {"variant": "dynamo", "prefill_weight": 2.0}).decide(
        features(prompt), state.view(), 0.0
    )
    assert decision.score_table() == {"i0": 2 * 1 + 3, "i1": 2 * 20}
    assert decision.instance_id == "i0"


def test_cache_aware_follows_a_good_match():
    state = cluster(3)
    prompt = tokens(0, 512)
    warm(state, "i2", prompt[:256])
    add_decoding(state, "i2", 5)
    decision = make_policy("cache_aware").decide(features(prompt), state.view(), 0.0)
    assert (decision.instance_id, decision.reason) == ("i2", "cache_hit")


def test_cache_aware_low_match_goes_least_loaded():
    state = cluster(2)
    prompt = tokens(0, 512)
    warm(state, "i1", prompt[:128])  # 25 % ≤ 30 %
    add_decoding(state, "i1", 1)
    decision = make_policy("cache_aware").decide(features(prompt), state.view(), 0.0)
    assert (decision.instance_id, decision.reason) == ("i0", "low_match")


def test_cache_aware_imbalance_overrides_the_cache():
    state = cluster(2)
    prompt = tokens(0, 512)
    warm(state, "i1", prompt)
    add_decoding(state, "i1", 10)
    add_decoding(state, "i0", 4)
    params = {"balance_abs_threshold": 5, "balance_rel_threshold": 2.0}
    decision = make_policy("cache_aware", params).decide(features(prompt), state.view(), 0.0)
    assert (decision.instance_id, decision.reason) == ("i0", "imbalance_fallback")
    params["balance_rel_threshold"] = 3.0  # 10 ≤ 3 × 4: balanced enough, follow the cache
    decision = make_policy("cache_aware", params).decide(features(prompt), state.view(), 0.0)
    assert (decision.instance_id, decision.reason) == ("i1", "cache_hit")
