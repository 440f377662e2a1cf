"""Behaviour every policy shares: eligibility, errors, registry, explanations."""

import pytest

from router_worker.routing import (
    DESCRIPTIONS,
    REGISTRY,
    ClusterState,
    Health,
    NoEligibleInstanceError,
    PolicyConfigError,
    make_policy,
    validate_params,
)

from .helpers import add_pending, cluster, features, tokens, warm

KINDS = sorted(REGISTRY)


def test_registry_lists_the_twelve_policies_with_descriptions():
    assert set(KINDS) == {
        "round_robin",
        "least_load",
        "linear",
        "cache_aware",
        "preble",
        "dualmap",
        "lmetric",
        "smetric",
        "predicted_ttft",
        "llmd",
        "llmd_precise",
        "decode_room",
    }
    assert all(DESCRIPTIONS[kind] for kind in KINDS)


@pytest.mark.parametrize("kind", KINDS)
def test_params_have_defaults_and_a_json_schema(kind):
    params = validate_params(kind, {})
    assert REGISTRY[kind].Params.model_json_schema()["type"] == "object"
    assert make_policy(kind, params.model_dump(), seed=1).params == params


@pytest.mark.parametrize(
    ("kind", "params", "field"),
    [
        ("linear", {"w": 1.5}, "w"),
        ("cache_aware", {"cache_threshold": -0.1}, "cache_threshold"),
        ("preble", {"th_bal": 0.5}, "th_bal"),
        ("dualmap", {"slo_ttft_s": 0}, "slo_ttft_s"),
        ("lmetric", {"hotspot": {"window_s": -1}}, "hotspot.window_s"),
        ("smetric", {"typo": 1}, "typo"),
        ("predicted_ttft", {"prefill_tps": 0}, "prefill_tps"),
        ("llmd", {"prefix_weight": -1}, "prefix_weight"),
        ("llmd_precise", {"affinity_threshold": 1.5}, "affinity_threshold"),
    ],
)
def test_invalid_params_name_the_field(kind, params, field):
    with pytest.raises(PolicyConfigError) as info:
        make_policy(kind, params)
    assert info.value.field == field and field in str(info.value)


@pytest.mark.parametrize(
    ("kind", "params", "message"),
    [
        ("lmetric", {"batch_offset": -1}, "lmetric.batch_offset: must be ≥ 0 (got -1)"),
        ("lmetric", {"hotspot": {"window_s": 0}}, "lmetric.hotspot.window_s: must be > 0 (got 0)"),
        (
            "lmetric",
            {"hotspot": {"enabled": "maybe"}},
            "lmetric.hotspot.enabled: must be true or false (got 'maybe')",
        ),
        (
            "lmetric",
            {"hotspot": {"wndow_s": 1}},
            "lmetric.hotspot.wndow_s: unknown parameter "
            "(known: enabled, max_hit_fraction, min_class_blocks, min_class_requests, window_s)",
        ),
        (
            "linear",
            {"variant": "x"},
            "linear.variant: must be one of 'weighted_sum' or 'dynamo' (got 'x')",
        ),
        (
            "predicted_ttft",
            {"chunk_tokens": 1.5},
            "predicted_ttft.chunk_tokens: must be a whole number (got 1.5)",
        ),
    ],
)
def test_invalid_params_say_what_is_allowed_and_what_was_given(kind, params, message):
    with pytest.raises(PolicyConfigError) as info:
        make_policy(kind, params)
    assert str(info.value) == message


def test_unknown_kind_is_a_config_error():
    with pytest.raises(PolicyConfigError, match="unknown policy kind 'nope'"):
        validate_params("nope", {})


@pytest.mark.parametrize("kind", KINDS)
def test_empty_cluster_raises_a_clear_error(kind):
    with pytest.raises(NoEligibleInstanceError, match="no healthy instance"):
        make_policy(kind).decide(features(tokens(0, 40)), ClusterState().view(), 0.0)


@pytest.mark.parametrize("kind", KINDS)
def test_all_draining_or_down_raises(kind):
    state = cluster(2)
    state.set_health("i0", Health.DRAINING)
    state.set_health("i1", Health.DOWN)
    with pytest.raises(NoEligibleInstanceError):
        make_policy(kind).decide(features(tokens(0, 40)), state.view(), 0.0)


@pytest.mark.parametrize("kind", KINDS)
def test_single_instance_is_always_chosen(kind):
    state = cluster(1)
    policy = make_policy(kind, seed=3)
    for k in range(5):
        decision = policy.decide(features(tokens(k * 7, 100)), state.view(), float(k))
        assert decision.instance_id == "i0"


@pytest.mark.parametrize("kind", KINDS)
def test_draining_and_down_instances_are_never_chosen_even_when_best(kind):
    state = cluster(3)
    prompt = tokens(0, 640)
    for busy in ("i1", "i2"):
        add_pending(state, busy, 5000)
    warm(state, "i1", prompt)
    warm(state, "i2", prompt)
    state.set_health("i0", Health.DRAINING)
    state.set_health("i1", Health.DOWN)
    policy = make_policy(kind, seed=5)
    for k in range(6):
        decision = policy.decide(features(prompt), state.view(), float(k))
        assert decision.instance_id == "i2"
        table = decision.score_table()
        assert table["i0"] is None and table["i1"] is None


@pytest.mark.parametrize("kind", KINDS)
def test_decision_explains_itself(kind):
    state = cluster(3)
    decision = make_policy(kind, seed=2).decide(features(tokens(0, 64)), state.view(), 0.0)
    explained = decision.to_dict()
    assert explained["instance"] == decision.instance_id
    assert set(explained["scores"]) == {"i0", "i1", "i2"}
    assert isinstance(explained["reason"], str) and explained["reason"]


@pytest.mark.parametrize(
    "kind",
    [
        "least_load",
        "linear",
        "lmetric",
        "smetric",
        "cache_aware",
        "predicted_ttft",
        "llmd",
        "llmd_precise",
    ],
)
def test_exact_ties_are_broken_by_seeded_random_not_list_order(kind):
    state = cluster(4)
    request = features(tokens(0, 64))
    chosen = {
        make_policy(kind, seed=s).decide(request, state.view(), 0.0).instance_id for s in range(40)
    }
    assert chosen == {"i0", "i1", "i2", "i3"}
    again = [
        make_policy(kind, seed=9).decide(request, state.view(), 0.0).instance_id for _ in range(3)
    ]
    assert len(set(again)) == 1  # same seed, same choice
