import itertools

import numpy as np

from router_worker.routing import make_policy
from router_worker.routing.policies.preble import PreblePolicy

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
    decision = policy.decide(
        features(np.concatenate([PREFIX[:256], tokens(9, 2048)])), state.view(), 0.0
    )
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
    policy = make_policy(
        "preble", {"window_s": 1.0, "min_cost_floor_tokens": 100, "decode_cost_tokens": 0}
    )
    for k in range(2):
        policy.decide(with_suffix(k), state.view(), 0.0)
    assert policy.decide(with_suffix(2), state.view(), 5.0).reason == "exploit"


# Rules isolated from one another: no rebalance (floor never reached), no P/D balancing.
ISOLATED = {"min_cost_floor_tokens": 1e9, "pd_ratio_threshold": 1.0}
_starts = itertools.count()


def unique(count):
    """A prompt no instance caches."""
    return features(tokens(50_000_000 + 100_000 * next(_starts), count))


def test_decode_cost_follows_the_mean_observed_output_length():
    state = cluster(2)
    policy = make_policy(
        "preble", {**ISOLATED, "decode_cost_tokens": 0, "decode_token_weight": 1.0}, seed=1
    )
    assert isinstance(policy, PreblePolicy)
    first = policy.decide(unique(1000), state.view(), 0.0).instance_id
    others = [policy.decide(unique(300), state.view(), 0.1 * k) for k in range(1, 4)]
    other = others[0].instance_id
    assert other != first and all(d.instance_id == other for d in others)
    for k, request in enumerate([unique(8) for _ in range(4)]):
        policy.observe_finish(request, first, 500, 1.0 + k)
    assert policy.decode_cost == 500
    # prefill only: `other` 900 + 300 < `first` 1000 + 300; with 500 tokens of decode per
    # request: `other` 900 + 3 × 500 + 300 = 2700 > `first` 1000 + 500 + 300 = 1800
    decision = policy.decide(unique(300), state.view(), 2.0)
    assert decision.instance_id == first and decision.reason == "explore"
    assert decision.score_table() == {first: 1800, other: 2700}


def test_decode_cost_keeps_the_prior_until_a_finish_is_observed():
    state = cluster(2)
    policy = make_policy("preble", {**ISOLATED, "decode_cost_tokens": 0}, seed=1)
    assert isinstance(policy, PreblePolicy)
    first = policy.decide(unique(1000), state.view(), 0.0).instance_id
    others = [policy.decide(unique(300), state.view(), 0.1 * k) for k in range(1, 4)]
    other = others[0].instance_id
    policy.observe_finish(unique(8), first, 0, 1.0)  # no usage reported: not a sample
    assert policy.decode_cost == 0
    decision = policy.decide(unique(300), state.view(), 2.0)
    assert decision.instance_id == other
    assert decision.score_table() == {first: 1300, other: 1200}


def _eviction_scenario(capacity_blocks):
    """i0 caches P0 that two recent requests reused; i1 caches P1 nobody reused."""
    state = cluster(2, capacity_blocks=capacity_blocks)
    warm(state, "i0", PREFIX)
    warm(state, "i1", tokens(7_000_000, 1024))
    policy = make_policy("preble", {**ISOLATED, "decode_cost_tokens": 0})
    for k in range(2):  # exploit: i0 is the only holder; 128 new tokens each
        assert policy.decide(with_suffix(k), state.view(), 0.1 * k).instance_id == "i0"
    # explore: i1 is idle (no eviction yet: 64 + 17 blocks ≤ capacity)
    assert policy.decide(unique(280), state.view(), 0.2).instance_id == "i1"
    return state, policy


def test_eviction_term_prices_the_shared_cache_a_request_would_evict():
    state, policy = _eviction_scenario(capacity_blocks=80)
    # r needs 40 blocks: both evict 64 + 40 − 80 = 24 blocks = 384 tokens; on i0 each is
    # used by 2 × 1024 hit tokens ÷ (1024 held × 3 window requests) = 2/3 → +256
    decision = policy.decide(unique(640), state.view(), 0.3)
    assert decision.score_table() == {"i0": 256 + 256 + 640, "i1": 280 + 640}
    assert decision.instance_id == "i1"  # without the term: i0 (896 < 920)


def test_eviction_term_is_zero_while_the_request_fits():
    state, policy = _eviction_scenario(capacity_blocks=10_000)
    decision = policy.decide(unique(640), state.view(), 0.3)
    assert decision.score_table() == {"i0": 256 + 640, "i1": 280 + 640}
    assert decision.instance_id == "i0"


def _pd_scenario(decode_cost_tokens):
    state = cluster(3)
    warm(state, "i0", PREFIX)
    policy = make_policy(
        "preble", {"min_cost_floor_tokens": 1e9, "decode_cost_tokens": decode_cost_tokens}
    )
    for k in range(3):  # cache hits: i0's window load is mostly decode
        assert policy.decide(with_suffix(k), state.view(), 0.1 * k).reason == "exploit"
    return state, policy


def test_prefill_heavy_request_goes_to_the_most_decode_bound_instance():
    state, policy = _pd_scenario(decode_cost_tokens=1000)  # ratio 1000 / 1128 = 0.89
    decision = policy.decide(unique(2048), state.view(), 1.0)
    assert decision.reason == "pd_balance" and decision.instance_id == "i0"


def test_no_pd_balancing_below_the_decode_ratio_threshold():
    state, policy = _pd_scenario(decode_cost_tokens=128)  # ratio 128 / 256 = 0.5
    decision = policy.decide(unique(2048), state.view(), 1.0)
    assert decision.reason == "explore" and decision.instance_id in {"i1", "i2"}


def _replay_prefix(policy, state, ttfts):
    """One request of the hot prefix per second; returns (second, reason, instance)."""
    out = []
    for k, ttft in enumerate(ttfts):
        request = with_suffix(k)
        decision = policy.decide(request, state.view(), float(k))
        out.append((k, decision.reason, decision.instance_id))
        policy.observe_first_token(request, decision.instance_id, ttft, k + 0.5)
    return out


def test_hot_prefix_is_replicated_when_its_ttft_doubles_over_an_adaptive_baseline():
    state = cluster(3)
    warm(state, "i0", PREFIX)
    policy = make_policy(
        "preble", {"min_samples": 4, "window_s": 10.0, "min_cost_floor_tokens": 1e9}
    )
    # a slow cold start (0.5 s), 20 s at 0.1 s, then 0.25 s: 2.5 × the best sub-window
    # mean but half the cold-start level (a baseline frozen on the first samples misses it)
    ttfts = [0.5] * 10 + [0.1] * 20 + [0.25] * 12
    decisions = _replay_prefix(policy, state, ttfts)
    # the window (k − 10, k] averages ≥ 0.2 once 7 of its 10 TTFTs are 0.25: k = 37
    assert all(d[1:] == ("exploit", "i0") for d in decisions[:37])
    assert decisions[37][1] == "replicate" and decisions[37][2] in {"i1", "i2"}
    # the window restarts: the next replica waits for 4 fresh, still degraded TTFTs
    assert [d[1] for d in decisions[38:41]] == ["exploit"] * 3
    assert decisions[41][1] == "replicate"


def test_no_replication_while_ttft_stays_near_its_baseline_in_a_long_run():
    state = cluster(3)
    warm(state, "i0", PREFIX)
    policy = make_policy(
        "preble", {"min_samples": 4, "window_s": 10.0, "min_cost_floor_tokens": 1e9}
    )
    # 200 s of noisy but steady TTFTs, then a shift to 1.7 × (below the factor of 2)
    ttfts = [0.1 if k % 2 else 0.18 for k in range(200)] + [0.24] * 60
    decisions = _replay_prefix(policy, state, ttfts)
    assert {d[1:] for d in decisions} == {("exploit", "i0")}
