"""The decode guard of lmetric and smetric: a cache hit may not pile decode onto the
instances holding a prefix (router_worker/routing/policies/decode_guard.py)."""

from __future__ import annotations

import pytest

from router_worker.routing import PolicyConfigError, make_policy
from router_worker.routing.policies.decode_guard import (
    REFERENCE_DECODE_COSTS,
    DecodeGuardParams,
    decode_load,
)

from .helpers import add_decoding_context, cluster, features, tokens, warm

PROMPT = tokens(0, 4096)
KINDS = ["lmetric", "smetric"]


def _holder_decoding(count: int, context: int = 20_000):
    """i0 holds PROMPT and decodes ``count`` requests of ``context`` tokens; i1, i2 idle."""
    state = cluster(3, capacity_blocks=100_000)
    add_decoding_context(state, "i0", count, context)
    warm(state, "i0", PROMPT)
    return state


def test_the_load_is_the_decode_step_in_context_tokens():
    state = _holder_decoding(8)
    params = make_policy("lmetric").params
    assert isinstance(params, DecodeGuardParams)
    load = decode_load(features(PROMPT), state.view(), params)
    fixed, seq = REFERENCE_DECODE_COSTS.values()
    assert load[0] == pytest.approx(fixed + seq * 9 + 8 * 20_000 + 4096)
    assert load[1] == pytest.approx(fixed + seq * 1 + 4096)


@pytest.mark.parametrize("kind", KINDS)
def test_a_hit_stays_on_its_holder_while_its_decode_step_is_within_the_slack(kind):
    state = _holder_decoding(8)  # 658k against 2 × 412k tokens' worth
    assert make_policy(kind).decide(features(PROMPT), state.view(), 0.0).instance_id == "i0"


@pytest.mark.parametrize("kind", KINDS)
def test_a_hit_leaves_a_holder_whose_decode_step_outgrows_the_slack(kind):
    state = _holder_decoding(20)  # 1.03M against 2 × 412k
    decision = make_policy(kind).decide(features(PROMPT), state.view(), 0.0)
    assert decision.instance_id in {"i1", "i2"}
    assert decision.scores[0] == float("inf")  # filtered, not outscored


@pytest.mark.parametrize("kind", KINDS)
def test_short_contexts_weigh_less_than_long_ones(kind):
    state = _holder_decoding(20, context=2_000)  # 661k: 20 short decodes are cheap
    assert make_policy(kind).decide(features(PROMPT), state.view(), 0.0).instance_id == "i0"


@pytest.mark.parametrize("kind", KINDS)
def test_a_fleet_whose_steps_cost_more_fixed_time_tolerates_more(kind):
    state = _holder_decoding(20)
    policy = make_policy(kind, {"decode_fixed_tokens": 1e6})  # 1.63M against 2 × 1.01M
    assert policy.decide(features(PROMPT), state.view(), 0.0).instance_id == "i0"


@pytest.mark.parametrize("kind", KINDS)
def test_without_the_guard_the_hit_wins_whatever_the_batch(kind):
    state = _holder_decoding(200)
    policy = make_policy(kind, {"decode_slack": None})
    assert policy.decide(features(PROMPT), state.view(), 0.0).instance_id == "i0"


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"decode_slack": 0.5}, "decode_slack"),
        ({"decode_fixed_tokens": 0}, "decode_fixed_tokens"),
        ({"decode_seq_tokens": -1}, "decode_seq_tokens"),
    ],
)
@pytest.mark.parametrize("kind", KINDS)
def test_invalid_guard_params_name_the_field(kind, params, field):
    with pytest.raises(PolicyConfigError, match=field):
        make_policy(kind, params)
