import numpy as np

from router_worker.routing import make_policy
from router_worker.routing.policies.dualmap import HashRing, PrefixHotnessTree

from .helpers import add_pending, cluster, features, tokens, warm


def ids(n):
    return tuple(f"i{k}" for k in range(n))


def test_adding_an_instance_remaps_few_keys_and_only_to_it():
    before, after = HashRing(ids(10), 1, 64), HashRing(ids(11), 1, 64)
    keys = [k * 0x9E3779B97F4A7C15 & (2**64 - 1) for k in range(2000)]
    moved = [k for k in keys if before.lookup(k) != after.lookup(k)]
    assert len(moved) / len(keys) < 0.2  # ≈ 1/11 expected
    assert all(after.lookup(k) == "i10" for k in moved)


def test_when_both_hashes_agree_the_second_candidate_is_another_instance():
    policy = make_policy("dualmap")
    pairs = [policy.candidates(k * 7919, ids(2)) for k in range(200)]
    assert all(first != second for first, second in pairs)
    ring1, ring2 = HashRing(ids(2), 1, 64), HashRing(ids(2), 2, 64)
    assert any(ring1.lookup(k * 7919) == ring2.lookup(k * 7919) for k in range(200))
    assert policy.candidates(123, ("solo",)) == ("solo", "solo")


def test_affinity_is_kept_within_slo_and_rebalanced_beyond_it():
    state = cluster(8)
    prompt = tokens(0, 1024)
    request = features(prompt)
    policy = make_policy("dualmap", {"slo_ttft_s": 0.5})
    first, second = policy.candidates(request.block_hashes[3], state.ids)
    warm(state, second, prompt)
    decision = make_policy("dualmap", {"slo_ttft_s": 0.5}).decide(request, state.view(), 0.0)
    assert (decision.instance_id, decision.reason) == (second, "affinity")
    assert set(k for k, v in decision.score_table().items() if v is not None) == {first, second}

    add_pending(state, second, 20_000)  # 2 s queue on the affinity candidate
    decision = make_policy("dualmap", {"slo_ttft_s": 0.5}).decide(
        features(prompt), state.view(), 0.0)
    assert (decision.instance_id, decision.reason) == (first, "hotspot_rebalance")


def shared_request(k):
    return features(np.concatenate([tokens(0, 32), tokens(1000 * (k + 1), 64)]))


def test_hot_prefix_lengthens_the_key_and_cold_shortens_it():
    tree = PrefixHotnessTree(min_key_blocks=2, window_s=10.0)
    depths = [tree.key_for(shared_request(k), instances=4, now=0.1 * k)[1] for k in range(4)]
    # shares are judged from n = 4 requests on; then ρ = 4/4 > 2/4: hot, key doubles
    assert depths == [2, 2, 2, 4]
    for k in range(20):  # other traffic inside the window dilutes the shared node
        tree.key_for(features(tokens(50_000 * (k + 1), 96)), instances=4, now=1.0 + 0.1 * k)
    # ρ = 5/25 < 1/4: cold, collapsed back to the short key
    assert tree.key_for(shared_request(99), instances=4, now=5.0)[1] == 2


def test_lone_requests_do_not_expand_keys():
    tree = PrefixHotnessTree(min_key_blocks=2, window_s=10.0)
    assert tree.key_for(shared_request(0), instances=8, now=0.0)[1] == 2


def test_short_prompt_is_keyed_by_request_id():
    tree = PrefixHotnessTree(min_key_blocks=4, window_s=10.0)
    a = tree.key_for(features(tokens(0, 8), request_id="a"), 4, 0.0)
    b = tree.key_for(features(tokens(0, 8), request_id="b"), 4, 0.0)
    assert a[1] == b[1] == 0 and a[0] != b[0]
