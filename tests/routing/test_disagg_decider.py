"""The decider: per request, split (prefill pool, then decode pool) or colocated."""

import numpy as np
import pytest

from router_worker.routing.disagg import DeciderParams, decide_split
from router_worker.runtime import ArmView

from .helpers import add_decoding, add_pending, cluster, features, tokens, warm

PREFILL, DECODE = ("i0",), ("i1", "i2")


def pools(state):
    def view(names):
        mask = [name in names for name in state.ids]
        return ArmView(state, np.array(mask))

    return view(PREFILL), view(DECODE)


def decide(state, request, **params):
    prefill, decode = pools(state)
    return decide_split(DeciderParams(**params), request, prefill, decode)


def test_always_and_never():
    state = cluster(3)
    request = features(tokens(0, 2000))
    assert decide(state, request, kind="always").split
    assert not decide(state, request, kind="never").split


def test_llm_d_threshold_counts_what_the_decode_pool_has_not_cached():
    state = cluster(3)
    prompt = tokens(0, 2000)
    assert decide(state, features(prompt), kind="prefix_threshold").split
    warm(state, "i2", prompt[:1920])  # the decode pool holds all but 80 tokens
    verdict = decide(state, features(prompt), kind="prefix_threshold")
    assert not verdict.split and verdict.uncached == 80
    assert decide(state, features(prompt), kind="prefix_threshold", threshold_tokens=50).split


def test_cost_splits_a_long_prompt_away_from_a_busy_decode_batch():
    state = cluster(3)
    for name in DECODE:
        add_decoding(state, name, 32)
    verdict = decide(state, features(tokens(0, 4000)))
    assert verdict.split and verdict.colocation_cost > verdict.split_cost


def test_cost_keeps_a_request_colocated_when_the_decode_pool_is_idle():
    state = cluster(3)
    verdict = decide(state, features(tokens(0, 4000)))
    assert not verdict.split  # no one decodes there: colocation stalls nobody


def test_cost_keeps_it_colocated_when_the_prefill_pool_is_congested():
    state = cluster(3)
    for name in DECODE:
        add_decoding(state, name, 8)
    request = features(tokens(0, 1000))
    assert decide(state, request).split
    add_pending(state, "i0", 200_000)  # 20 s of prefill queued on the only prefill instance
    congested = decide(state, request)
    assert not congested.split and congested.split_cost > congested.colocation_cost


def test_cost_keeps_it_colocated_when_no_decode_instance_has_room():
    state = cluster(3, capacity_blocks=100)
    for name in DECODE:
        add_decoding(state, name, 32)
        state.on_scrape(name, 1.0, kv_usage=0.9)
    verdict = decide(state, features(tokens(0, 4000)))
    assert not verdict.split and verdict.reason == "no_room"


@pytest.mark.parametrize("kind", ["always", "cost", "prefix_threshold"])
def test_without_a_prefill_pool_nothing_is_split(kind):
    from router_worker.routing import Health

    state = cluster(3)
    state.set_health("i0", Health.DOWN)
    verdict = decide(state, features(tokens(0, 4000)), kind=kind)
    assert not verdict.split and verdict.reason == "no_pool"


def test_cost_keeps_it_colocated_when_every_instance_decodes_as_well():
    """Instances of role both (prefill pool = decode pool): a split's prefill stalls the
    batch decoding where it runs just as colocation would, so it spares nothing; it only
    adds a read and a second queue."""
    state = cluster(3)
    for name in state.ids:
        add_decoding(state, name, 32)
    every = ArmView(state, np.ones(len(state.ids), dtype=bool))
    verdict = decide_split(DeciderParams(), features(tokens(0, 4000)), every, every)
    assert not verdict.split and verdict.colocation_cost <= 0


def test_cost_still_splits_onto_a_prefill_instance_beside_instances_of_role_both():
    state = cluster(3)
    for name in DECODE:
        add_decoding(state, name, 32)
    prefill = ArmView(state, np.ones(len(state.ids), dtype=bool))  # i0 prefill, i1-2 both
    _, decode = pools(state)
    verdict = decide_split(DeciderParams(), features(tokens(0, 4000)), prefill, decode)
    assert verdict.split and verdict.colocation_cost > verdict.split_cost
