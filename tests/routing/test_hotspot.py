"""LMetric hotspot detector scenarios with exact numbers.

Cluster of 4; class prefix = 64 tokens (4 blocks) cached on i0 only, so
M = {i0}, m = 1, m̄ = 3. Class requests = prefix + a unique 16-token suffix.
Detector: window 10 s, classes need ≥ 2 blocks, ≥ 2 class requests in window.
"""

import numpy as np
import pytest

from router_worker.routing import make_policy

from .helpers import add_decoding, cluster, features, tokens, warm

PREFIX = tokens(0, 64)
PARAMS = {
    "hotspot": {
        "window_s": 10.0,
        "min_class_blocks": 2,
        "min_class_requests": 2,
        "max_hit_fraction": 0.5,
    }
}


def setup():
    state = cluster(4)
    warm(state, "i0", PREFIX)
    return state, make_policy("lmetric", PARAMS, seed=1)


def class_request(k, now):
    suffix = tokens(100_000 + 16 * k, 16)
    return features(np.concatenate([PREFIX, suffix]), now=now)


def other_request(k, now):
    return features(tokens(900_000 + 1000 * k, 80), now=now)


def numbers(event):
    return (event.kind, event.x, event.x_bar, event.m, event.m_bar, event.instances)


def test_no_hotspot_while_the_ratio_test_passes():
    state, policy = setup()
    events, t = [], 0.0
    for k in range(4):
        for j in range(3):  # x/x̄ never exceeds 1/3 = |M|/|M̄|
            t += 0.1
            events += policy.decide(other_request(3 * k + j, t), state.view(), t).events
        t += 0.1
        decision = policy.decide(class_request(k, t), state.view(), t)
        events += decision.events
        assert decision.instance_id == "i0" and decision.reason == "score"
    assert events == []
    assert policy.guard.detector.state_of(class_request(0, t).block_hashes[3]) == "normal"


def test_suspected_the_first_time_the_ratio_test_fails_and_not_before():
    """m/m̄ = 1/3: the class is suspected as soon as x·m̄ > x̄·m, neither at the boundary
    (x = 2 against x̄ = 6: 6 = 6) nor only once its share is far above M's."""
    state, policy = setup()
    view = state.view()
    t, seen = 0.0, []
    for j in range(6):
        t += 0.1
        seen += policy.decide(other_request(j, t), view, t).events
    for k in range(2):  # x = 1 (< min_class_requests), then x = 2 against x̄ = 6
        t += 0.1
        seen += policy.decide(class_request(k, t), view, t).events
    assert seen == []
    for j in range(6, 8):
        t += 0.1
        seen += policy.decide(other_request(j, t), view, t).events
    t += 0.1
    (suspected,) = policy.decide(class_request(2, t), view, t).events  # 3·3 = 9 > 8·1
    assert numbers(suspected) == ("suspected", 3, 8, 1, 3, ("i0",))


def test_burst_is_suspected_confirmed_falls_back_and_clears():
    state, policy = setup()
    view = state.view()
    decisions = [policy.decide(class_request(k, 0.1 * k), view, 0.1 * k) for k in range(4)]
    assert [d.instance_id for d in decisions] == ["i0"] * 4
    assert decisions[0].events == ()  # x = 1 < min_class_requests
    (suspected,) = decisions[1].events
    assert numbers(suspected) == ("suspected", 2, 0, 1, 3, ("i0",))
    assert suspected.confirmations_needed == 2 and suspected.prefix_tokens == 64
    assert decisions[2].events == ()  # first of the next 2|M| = 2, placed on M
    (confirmed,) = decisions[3].events
    assert numbers(confirmed) == ("confirmed", 4, 0, 1, 3, ("i0",))
    assert confirmed.confirmations == 2

    fallback = policy.decide(class_request(4, 0.5), view, 0.5)
    assert fallback.reason == "hotspot_fallback" and fallback.instance_id != "i0"
    assert fallback.score_table()["i0"] is None
    state.on_dispatch(class_request(4, 0.5), fallback.instance_id, 0.5)  # M grows to 2

    for j in range(10):
        policy.decide(other_request(j, 1.0 + 0.1 * j), view, 1.0 + 0.1 * j)
    after = policy.decide(class_request(5, 3.0), view, 3.0)
    (cleared,) = after.events
    # x = 6 class requests, x̄ = 10 others, m = 2, m̄ = 2: 6·2 ≤ 10·2
    assert numbers(cleared)[:5] == ("cleared", 6, 10, 2, 2)
    assert set(cleared.instances) == {"i0", fallback.instance_id}
    assert after.reason == "score"


def test_suspicion_is_dismissed_when_the_product_already_avoids_m():
    state, policy = setup()
    view = state.view()
    policy.decide(class_request(0, 0.0), view, 0.0)
    (suspected,) = policy.decide(class_request(1, 0.1), view, 0.1).events
    assert suspected.kind == "suspected"
    add_decoding(state, "i0", 300)  # i0 now busy: 16 × (300 + 48) vs 80 × (0 + 48) elsewhere
    decision = policy.decide(class_request(2, 0.2), view, 0.2)
    assert decision.instance_id != "i0"
    (dismissed,) = decision.events
    assert numbers(dismissed) == ("dismissed", 3, 0, 1, 3, ("i0",))


def test_confirmed_class_clears_when_it_leaves_the_window():
    state, policy = setup()
    view = state.view()
    for k in range(4):
        policy.decide(class_request(k, 0.1 * k), view, 0.1 * k)
    assert policy.decide(class_request(4, 0.5), view, 0.5).reason == "hotspot_fallback"
    later = policy.decide(other_request(0, 20.0), view, 20.0)
    (cleared,) = later.events
    assert numbers(cleared)[:5] == ("cleared", 0, 0, 1, 0)


def test_class_cached_on_most_instances_is_not_a_hotspot():
    state, policy = setup()
    warm(state, "i1", PREFIX)
    warm(state, "i2", PREFIX)  # m = 3 of 4 > max_hit_fraction
    view = state.view()
    events = []
    for k in range(8):
        events += policy.decide(class_request(k, 0.1 * k), view, 0.1 * k).events
    assert events == []


# SMetric takes a request for a follow-up from a local hit of ≥ 256 tokens by default;
# these 80-token requests hold 64 on i0
FOLLOW_UPS = {"smetric": {"followup_min_hit_tokens": 16}}


@pytest.mark.parametrize("kind", ["smetric", "predicted_ttft"])
def test_our_other_policies_run_the_same_guard(kind):
    """SMetric and predicted_ttft follow the hit to i0 until the class is confirmed hot,
    then place it outside M by their own rule, with the same events as LMetric."""
    state = cluster(4)
    warm(state, "i0", PREFIX)
    policy = make_policy(kind, PARAMS | FOLLOW_UPS.get(kind, {}), seed=1)
    view = state.view()
    decisions = [policy.decide(class_request(k, 0.1 * k), view, 0.1 * k) for k in range(4)]
    assert [d.instance_id for d in decisions] == ["i0"] * 4
    kinds = [event.kind for d in decisions for event in d.events]
    assert kinds == ["suspected", "confirmed"]

    fallback = policy.decide(class_request(4, 0.5), view, 0.5)
    assert fallback.reason == "hotspot_fallback" and fallback.instance_id != "i0"
    assert fallback.details["hot_class"] == f"{class_request(0, 0).block_hashes[3]:016x}"
    assert fallback.score_table()["i0"] is None


@pytest.mark.parametrize("kind", ["lmetric", "smetric", "predicted_ttft"])
def test_the_guard_switched_off_never_falls_back(kind):
    state = cluster(4)
    warm(state, "i0", PREFIX)
    off = {"hotspot": {**PARAMS["hotspot"], "enabled": False}}
    policy = make_policy(kind, off | FOLLOW_UPS.get(kind, {}), seed=1)
    view = state.view()
    decisions = [policy.decide(class_request(k, 0.1 * k), view, 0.1 * k) for k in range(8)]
    assert {d.instance_id for d in decisions} == {"i0"}
    assert all(d.events == () and d.reason != "hotspot_fallback" for d in decisions)
