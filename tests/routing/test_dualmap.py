import dataclasses

import numpy as np

from router_worker.routing import QueuedRequest, make_policy
from router_worker.routing.policies.dualmap import DualMapPolicy, HashRing, PrefixHotnessTree

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
    assert isinstance(policy, DualMapPolicy)
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
    assert isinstance(policy, DualMapPolicy)
    first, second = policy.candidates(request.block_hashes[3], tuple(state.ids))
    warm(state, second, prompt)
    decision = make_policy("dualmap", {"slo_ttft_s": 0.5}).decide(request, state.view(), 0.0)
    assert (decision.instance_id, decision.reason) == (second, "affinity")
    assert set(k for k, v in decision.score_table().items() if v is not None) == {first, second}

    add_pending(state, second, 20_000)  # 2 s queue on the affinity candidate
    decision = make_policy("dualmap", {"slo_ttft_s": 0.5}).decide(
        features(prompt), state.view(), 0.0
    )
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


# ----- queued-request migration ------------------------------------------------------


def queue_on(state, instance_id, sizes, alternatives, now=0.0, waited=None):
    """Dispatch one request per size to ``instance_id``; each names (source, alternative)."""
    queued = []
    for k, (size, alternative) in enumerate(zip(sizes, alternatives, strict=True)):
        arrival = now - (waited[k] if waited else 0.0)
        request = features(tokens(20_000_000 + 100_000 * k, size), now=arrival)
        uncached = state.on_dispatch(request, instance_id, arrival + 1e-3 * k, cached_tokens=0)
        queued.append(
            QueuedRequest(
                request, instance_id, arrival + 1e-3 * k, uncached, (instance_id, alternative)
            )
        )
    return queued


def moved(policy, state, queued, now=0.0):
    return [(m.request_id, m.target) for m in policy.migrations(state.view(), queued, now)]


def test_queued_requests_move_largest_benefit_first_until_the_queue_meets_the_slo():
    state = cluster(8)  # 10 000 prefill tokens/s: 4000 tokens = 0.4 s
    queued = queue_on(state, "i0", [4000] * 5, ["i1", "i2", "i3", "i4", "i5"])
    policy = make_policy("dualmap", {"slo_ttft_s": 1.0})
    ids_ = [q.features.request_id for q in queued]
    # queue 0.4/0.8/1.2/1.6/2.0 s; each alternative idle (0.4 s): the tail moves first,
    # and moving stops once the rest (0.4, 0.8) meets 1 s
    assert moved(policy, state, queued) == [(ids_[4], "i5"), (ids_[3], "i4"), (ids_[2], "i3")]


def test_moves_onto_one_target_count_its_growing_queue():
    state = cluster(8)
    queued = queue_on(state, "i0", [4000] * 5, ["i1"] * 5)
    ids_ = [q.features.request_id for q in queued]
    # the second move would wait 0.8 s on i1 (< 1 s), a third 1.2 s: not allowed
    assert moved(make_policy("dualmap", {"slo_ttft_s": 1.0}), state, queued) == [
        (ids_[4], "i1"),
        (ids_[3], "i1"),
    ]


def test_no_migration_when_the_queue_meets_the_slo():
    state = cluster(8)
    queued = queue_on(state, "i0", [4000] * 5, ["i1", "i2", "i3", "i4", "i5"])
    assert moved(make_policy("dualmap", {"slo_ttft_s": 2.5}), state, queued) == []


def test_no_migration_when_no_alternative_meets_the_slo():
    state = cluster(8)
    for k in range(1, 6):
        add_pending(state, f"i{k}", 9_000)  # 0.9 s + 0.4 s own prefill > 1 s
    queued = queue_on(state, "i0", [4000] * 5, ["i1", "i2", "i3", "i4", "i5"])
    assert moved(make_policy("dualmap", {"slo_ttft_s": 1.0}), state, queued) == []


def test_no_migration_without_benefit_even_if_it_would_help_the_queue():
    state = cluster(8)
    add_pending(state, "i2", 20_000)
    # head: 0.4 s here, 0.4 s on idle i1 (B = 0); tail: 1.2 s here, 2.8 s on i2.
    # Moving the head would bring the tail to 0.8 s, but B ≤ 0 is never moved.
    queued = queue_on(state, "i0", [4000, 8000], ["i1", "i2"])
    assert moved(make_policy("dualmap", {"slo_ttft_s": 1.0}), state, queued) == []


def test_unmovable_and_hopeless_requests_stay():
    state = cluster(8)
    queued = queue_on(state, "i0", [4000] * 3, ["i1", "i2", "i3"])
    queued[-1] = dataclasses.replace(queued[-1], movable=False)  # engine already admitted it
    policy = make_policy("dualmap", {"slo_ttft_s": 1.0})
    assert moved(policy, state, queued) == [(queued[1].features.request_id, "i2")]
    # the head already waited past the SLO: no move can save it, and it does not make the
    # request behind it (0.8 s, within the SLO) move
    other = cluster(8)
    late = queue_on(other, "i0", [4000] * 2, ["i1", "i2"], waited=[5.0, 0.0])
    assert moved(policy, other, late) == []


def test_migration_can_be_switched_off():
    state = cluster(8)
    queued = queue_on(state, "i0", [4000] * 5, ["i1", "i2", "i3", "i4", "i5"])
    policy = make_policy("dualmap", {"slo_ttft_s": 1.0, "migrate_queued": False})
    assert not policy.migrates and make_policy("dualmap").migrates
    assert not make_policy("lmetric").migrates
    assert moved(make_policy("lmetric"), state, queued) == []
