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


def route(policy, state, request, now):
    """Decide and dispatch, as the router does (the request is then in flight)."""
    decision = policy.decide(request, state.view(), now)
    state.on_dispatch(request, decision.instance_id, now)
    return decision


def measure_tpot(policy, instance_id, tpot, output_tokens=101, at=1.0):
    """Feed one finished request: first token at ``at``, then a TPOT of ``tpot``."""
    request = unique(8)
    policy.observe_first_token(request, instance_id, 0.5, at)
    policy.observe_finish(request, instance_id, output_tokens, at + tpot * (output_tokens - 1))


def test_decode_term_prices_requests_in_flight_at_the_instances_tpot():
    """Preble's decode load: in-flight requests × output length × the GPU's TPOT (here
    101 tokens × 10 ms × 10,000 prefill tokens/s = 10,100 prefill-token equivalents)."""
    state = cluster(2)
    policy = make_policy("preble", ISOLATED, seed=1)
    assert isinstance(policy, PreblePolicy)
    measure_tpot(policy, "i1", 0.01)
    state.on_dispatch(unique(8), "i1", 2.0)  # in flight on i1, sent by no decision here
    decision = policy.decide(unique(300), state.view(), 2.0)
    assert decision.score_table() == {"i0": 300, "i1": 10_100 + 300}
    assert decision.instance_id == "i0"


def test_decode_term_forgets_finished_requests_though_their_prefill_stays_in_the_window():
    state = cluster(2)
    policy = make_policy("preble", ISOLATED, seed=1)
    measure_tpot(policy, "i0", 0.01)
    measure_tpot(policy, "i1", 0.01)
    request = unique(300)
    sent = route(policy, state, request, 2.0).instance_id
    other = policy.decide(unique(300), state.view(), 2.0)  # decided, never sent
    assert other.instance_id != sent
    assert other.score_table() == {sent: 300 + 10_100 + 300, other.instance_id: 300}
    state.on_first_token(request.request_id, 2.5)
    state.on_finish(request.request_id, 3.0)
    later = policy.decide(unique(300), state.view(), 3.0).score_table()
    assert later == {sent: 300 + 300, other.instance_id: 300 + 300}


def test_a_burst_is_spread_once_its_decodes_outweigh_the_window_gap():
    """Three requests at one instant: the instance with the lightest window takes the
    first two, then its in-flight decodes make another one cheaper (prices as above)."""
    state = cluster(3)
    policy = make_policy("preble", ISOLATED, seed=1)
    for instance_id in ("i0", "i1", "i2"):
        measure_tpot(policy, instance_id, 0.01)
    loaded = set()
    for _ in range(2):  # 12,000 tokens of finished prefill in two windows
        request = unique(12_000)
        loaded.add(route(policy, state, request, 2.0).instance_id)
        state.on_finish(request.request_id, 2.0)
    (light,) = {"i0", "i1", "i2"} - loaded
    burst = [route(policy, state, unique(1000), 3.0).instance_id for _ in range(3)]
    # light: 1000 → 1000 + 10,100 + 1000 = 12,100 < 13,000 → then 23,200 > 13,000
    assert burst[:2] == [light, light] and burst[2] in loaded


def test_each_instance_prices_a_decode_token_at_its_own_median_tpot():
    state = cluster(3)
    policy = make_policy("preble", ISOLATED, seed=1)
    for tpot in (0.01, 0.02, 0.5):  # median 20 ms: one slow outlier does not move it
        measure_tpot(policy, "i0", tpot)
    measure_tpot(policy, "i1", 0.01)
    for instance_id in ("i0", "i1", "i2"):
        state.on_dispatch(unique(8), instance_id, 2.0)
    scores = policy.decide(unique(300), state.view(), 2.0).score_table()
    # i2 has no TPOT yet: the prior price, 50 prefill tokens per decode token
    assert scores == {"i0": 20_200 + 300, "i1": 10_100 + 300, "i2": 101 * 50 + 300}


def test_decode_cost_keeps_the_prior_until_a_finish_is_observed():
    state = cluster(2)
    policy = make_policy("preble", {**ISOLATED, "decode_cost_tokens": 700}, seed=1)
    assert isinstance(policy, PreblePolicy)
    state.on_dispatch(unique(8), "i0", 0.0)
    policy.observe_finish(unique(8), "i0", 0, 1.0)  # no usage reported: not a sample
    assert policy.decode_cost == 700
    assert policy.decide(unique(300), state.view(), 2.0).score_table() == {
        "i0": 700 + 300,
        "i1": 300,
    }


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
    for k in range(3):  # cache hits in flight: i0's load is mostly decode
        assert route(policy, state, with_suffix(k), 0.1 * k).reason == "exploit"
    return state, policy


def test_prefill_heavy_request_goes_to_the_most_decode_bound_instance():
    state, policy = _pd_scenario(decode_cost_tokens=1000)  # 3000 / (3 × 128 + 3000) = 0.89
    decision = policy.decide(unique(2048), state.view(), 1.0)
    assert decision.reason == "pd_balance" and decision.instance_id == "i0"


def test_no_pd_balancing_below_the_decode_ratio_threshold():
    state, policy = _pd_scenario(decode_cost_tokens=128)  # 384 / (384 + 384) = 0.5
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
    ttfts = [0.5] * 10 + [0.1] * 20 + [0.25] * 13
    decisions = _replay_prefix(policy, state, ttfts)
    # the window (k − 10, k] averages ≥ 0.2 once 7 of its 10 TTFTs are 0.25: k = 37
    assert all(d[1:] == ("exploit", "i0") for d in decisions[:37])
    assert decisions[37][1] == "replicate" and decisions[37][2] in {"i1", "i2"}
    # the window restarts: the next replica waits for 4 fresh, still degraded TTFTs on
    # i0 (the replica's own TTFT counts for the instance it ran on)
    assert [d[1] for d in decisions[38:42]] == ["exploit"] * 4
    assert decisions[42][1] == "replicate"


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


def test_replication_looks_at_the_ttfts_of_the_holder_the_exploit_chose():
    """Preble's overload detector is per (prefix, GPU): TTFTs that doubled on i0 say
    nothing about i1, which holds the same prefix."""
    state = cluster(3)
    warm(state, "i0", PREFIX)
    warm(state, "i1", PREFIX)
    policy = make_policy(
        "preble",
        {
            "min_samples": 4,
            "window_s": 10.0,
            "min_cost_floor_tokens": 1e9,
            "decode_cost_tokens": 1e4,
        },
    )
    requests = [with_suffix(k) for k in range(36)]
    for request in requests:  # decided before any feedback: nothing is degraded yet
        policy.decide(request, state.view(), 0.0)
    for k, request in enumerate(requests):  # every TTFT reported from i0: 0.1 s, then 0.5 s
        policy.observe_first_token(request, "i0", 0.1 if k < 20 else 0.5, 0.5 * k + 0.1)
    state.on_dispatch(unique(8), "i0", 18.0)  # i0 costs 10,000 more: i1 is the holder
    assert policy.decide(with_suffix(100), state.view(), 18.0).instance_id == "i1"
    assert policy.decide(with_suffix(101), state.view(), 18.0).reason == "exploit"
    for _ in range(2):  # now i1 costs more: the exploit would go to the degraded i0
        state.on_dispatch(unique(8), "i1", 18.0)
    decision = policy.decide(with_suffix(102), state.view(), 18.0)
    assert (decision.reason, decision.instance_id) == ("replicate", "i2")
