import numpy as np

from router_worker.routing import make_policy

from .helpers import cluster, features, tokens, warm

PREFIX = tokens(0, 1024)


def with_suffix(k, length=128):
    return features(np.concatenate([PREFIX, tokens(100_000 + 1000 * k, length)]))


def test_exploit_when_matched_exceeds_new_tokens():
    state = cluster(3)
    warm(state, "i1", PREFIX)
    warm(state, "i2", PREFIX)
    policy = make_policy("preble", seed=2)
    decision = policy.decide(with_suffix(0), state.view(), 0.0)
    assert decision.reason == "exploit" and decision.instance_id in {"i1", "i2"}
    # its windowed cost now includes that request, so the other holder is next
    other = policy.decide(with_suffix(1), state.view(), 0.1)
    assert other.reason == "exploit" and other.instance_id != decision.instance_id


def test_explore_by_load_cost_when_new_tokens_dominate():
    state = cluster(3)
    warm(state, "i0", PREFIX[:256])
    policy = make_policy("preble", seed=2)
    decision = policy.decide(features(np.concatenate([PREFIX[:256], tokens(9, 2048)])),
                             state.view(), 0.0)
    assert decision.reason == "explore"
    assert decision.instance_id == "i0"  # lowest cost: 2048 new tokens vs 2304 elsewhere
    assert decision.score_table() == {"i0": 2048, "i1": 2304, "i2": 2304}


def test_rebalance_when_the_chosen_cost_reaches_th_bal_times_the_minimum():
    state = cluster(2)
    warm(state, "i0", PREFIX)
    policy = make_policy("preble", {"min_cost_floor_tokens": 100, "decode_cost_tokens": 0})
    reasons = []
    for k in range(4):
        decision = policy.decide(with_suffix(k), state.view(), 0.1 * k)
        reasons.append((decision.instance_id, decision.reason))
    # i0 accrues 129 tokens per exploit; i1 stays at 0 → floor 100, 1.5 × 100 = 150
    assert reasons[:2] == [("i0", "exploit"), ("i0", "exploit")]
    assert reasons[2] == ("i1", "rebalance")


def test_window_forgets_old_load():
    state = cluster(2)
    warm(state, "i0", PREFIX)
    policy = make_policy("preble", {"window_s": 1.0, "min_cost_floor_tokens": 100,
                                    "decode_cost_tokens": 0})
    for k in range(2):
        policy.decide(with_suffix(k), state.view(), 0.0)
    assert policy.decide(with_suffix(2), state.view(), 5.0).reason == "exploit"


def test_hot_prefix_is_replicated_when_its_ttft_doubles():
    state = cluster(3)
    warm(state, "i0", PREFIX)
    policy = make_policy("preble", {"baseline_samples": 4, "window_s": 3.0,
                                    "min_cost_floor_tokens": 1e9})
    for k in range(6):
        request = with_suffix(k)
        decision = policy.decide(request, state.view(), float(k))
        assert decision.reason == "exploit" and decision.instance_id == "i0"
        ttft = 0.1 if k < 4 else 0.3  # baseline: mean of the first 4 = 0.1 s
        policy.observe_first_token(request, "i0", ttft, k + 0.5)
    # at t = 5 the window (2, 5] averaged (0.1 + 0.1 + 0.3) / 3 < 0.2: still exploit;
    # at t = 6 it holds (0.1 + 0.3 + 0.3) / 3 ≥ 2 × 0.1: replicate elsewhere
    replica = policy.decide(with_suffix(6), state.view(), 6.0)
    assert replica.reason == "replicate" and replica.instance_id in {"i1", "i2"}
    assert policy.decide(with_suffix(7), state.view(), 7.0).reason == "exploit"
