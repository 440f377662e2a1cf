from typing import cast

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from router_worker.routing import ClusterState, ClusterView, GlobalTier, make_policy

from .helpers import (
    add_decoding,
    add_decoding_context,
    add_pending,
    cluster,
    features,
    tokens,
    warm,
)

# The paper's exact score, P-token × BS: these tests pin what BS counts.
PAPER = {"batch_offset": 0.0, "tier_token_cost": None, "decode_slack": None, "kv_pressure": False}


def test_minimum_product_of_p_token_and_batch_size():
    state = cluster(2)
    add_pending(state, "i0", 1000)
    add_decoding(state, "i0", 2)  # P0 = 1000 + 100 (+2 one-token prompts done)
    add_decoding(state, "i1", 5)  # P1 = 100, BS1 = 5
    decision = make_policy("lmetric", PAPER).decide(features(tokens(0, 100)), state.view(), 0.0)
    assert decision.instance_id == "i1"
    # BS0 = 3: the 1000-token request is prefilling, so it is in i0's running batch
    # next to the 2 decoding ones (vLLM v1 schedules them in the same steps).
    assert decision.score_table() == {"i0": 1100 * 3, "i1": 100 * 5}


def test_cache_hit_lowers_p_token():
    state = cluster(2)
    prompt = tokens(0, 1024)
    warm(state, "i0", prompt)
    add_decoding(state, "i0", 4)
    add_decoding(state, "i1", 2)
    decision = make_policy("lmetric", PAPER).decide(features(prompt), state.view(), 0.0)
    assert decision.instance_id == "i0"  # 1 × 4 beats 1024 × 2
    assert decision.cached_tokens == 1023


def test_idle_instances_tie_on_zero_and_lower_p_token_wins():
    state = cluster(4)
    prompt = tokens(0, 320)
    warm(state, "i2", prompt[:160])
    warm(state, "i3", prompt[:160])
    for seed in range(10):
        policy = make_policy("lmetric", PAPER, seed=seed)
        decision = policy.decide(features(prompt), state.view(), 0.0)
        assert decision.score_table() == {"i0": 0, "i1": 0, "i2": 0, "i3": 0}
        assert decision.instance_id in ("i2", "i3")  # P-token 160 vs 320 (i0, i1)
    # i3 starts prefilling a 50-token request: it is no longer idle (BS 1, score
    # 1 × 210), so the idle instance with the same cache hit wins outright.
    add_pending(state, "i3", 50)
    for seed in range(10):
        policy = make_policy("lmetric", PAPER, seed=seed)
        decision = policy.decide(features(prompt), state.view(), 0.0)
        assert decision.score_table() == {"i0": 0, "i1": 0, "i2": 0, "i3": 210}
        assert decision.instance_id == "i2"


def test_an_instance_prefilling_a_long_request_is_not_idle():
    """The replay report's failure: BS 0 while a >100k-token prefill runs made the product 0."""
    state = cluster(2)
    prompt = tokens(0, 1024)
    warm(state, "i0", prompt[:64])  # a small part of the prompt is cached on i0
    long_request = add_pending(state, "i0", 120_000)  # dispatched, no first token yet
    add_decoding(state, "i1", 2)  # i1 decodes two short requests
    view = state.view()
    assert view.batch_size.tolist() == [1, 2]
    decision = make_policy("lmetric", PAPER).decide(features(prompt), view, 0.0)
    # Before BS counted prefilling requests, i0 scored 0 × … = 0 and won.
    assert decision.score_table() == {"i0": (120_000 + 960) * 1, "i1": 1024 * 2}
    assert decision.instance_id == "i1"
    # Its first token does not change BS (prefilling → decoding), only P-token.
    state.on_first_token(long_request, 1.0)
    assert view.batch_size.tolist() == [1, 2]
    state.on_finish(long_request, 2.0)
    assert view.batch_size.tolist() == [0, 2]


def test_a_large_cache_hit_still_beats_a_busier_batch():
    state = cluster(2)
    prompt = tokens(0, 4096)
    warm(state, "i0", prompt)
    add_pending(state, "i0", 500)  # i0 is prefilling something else: BS 1
    add_decoding(state, "i1", 1)
    decision = make_policy("lmetric", PAPER).decide(features(prompt), state.view(), 0.0)
    assert decision.score_table() == {"i0": (500 + 1) * 1, "i1": 4096 * 1}
    assert decision.instance_id == "i0"


class StubView:
    """The slice of ClusterView LMetric reads, with chosen indicator values."""

    def __init__(self, p_tokens, batch):
        self._p = np.asarray(p_tokens, dtype=float)
        self.batch_size = np.asarray(batch, dtype=float)
        self.size = len(self._p)
        self.ids = tuple(f"i{k}" for k in range(self.size))
        self.eligible = np.ones(self.size, dtype=bool)

    def p_tokens(self, _request, *, tier_token_cost=None):
        return self._p

    def cached_blocks(self, _request):
        return np.zeros(self.size, dtype=int)

    def cached_tokens(self, _request):
        return np.zeros(self.size, dtype=int)


indicators = st.lists(st.tuples(st.integers(1, 5000), st.integers(0, 64)), min_size=1, max_size=12)


@settings(max_examples=80, deadline=None)
@given(
    indicators,
    st.sampled_from([0.001, 0.5, 3.0, 1000.0]),
    st.sampled_from([0.01, 1.0, 7.0, 64.0]),
    st.integers(0, 2**16),
)
def test_choice_is_invariant_under_positive_scaling_of_either_indicator(
    values, p_scale, bs_scale, seed
):
    p_tokens, batch = zip(*values, strict=True)
    # A tie of products (36 x 10 = 60 x 6) stays a tie only in exact arithmetic: scaled in
    # floats, rounding decides it. The property is about choices the scores make.
    products = np.array(p_tokens, dtype=float) * np.array(batch, dtype=float)
    assume(np.count_nonzero(np.isclose(products, products.min(), rtol=1e-9, atol=0)) == 1)
    request = features(tokens(0, 16))
    view = cast(ClusterView, StubView(p_tokens, batch))
    base = make_policy("lmetric", PAPER, seed=seed).decide(request, view, 0.0)
    scaled_view = cast(
        ClusterView, StubView(np.array(p_tokens) * p_scale, np.array(batch) * bs_scale)
    )
    scaled = make_policy("lmetric", PAPER, seed=seed).decide(request, scaled_view, 0.0)
    assert scaled.instance_id == base.instance_id


def test_the_default_counts_the_batch_from_an_offset_so_an_idle_instance_is_not_free():
    """The paper's form scores an idle instance 0 whatever its cache; the default does not."""
    state = cluster(2)
    prompt = tokens(0, 4096)
    warm(state, "i0", prompt)
    add_decoding(state, "i0", 3)  # the holder runs 3 requests, i1 is idle
    request = features(prompt)
    paper = make_policy("lmetric", PAPER).decide(request, state.view(), 0.0)
    assert paper.score_table() == {"i0": 1 * 3, "i1": 0}
    assert paper.instance_id == "i1"  # the cache is thrown away
    default = make_policy("lmetric").decide(request, state.view(), 0.0)  # c = 1
    assert default.score_table() == {"i0": 1 * (3 + 1), "i1": 4096 * (0 + 1)}
    assert default.instance_id == "i0"
    larger = make_policy("lmetric", {"batch_offset": 48}).decide(request, state.view(), 0.0)
    assert larger.score_table() == {"i0": 1 * 51, "i1": 4096 * 48}


def test_a_large_batch_still_outweighs_a_cache_hit_under_the_default():
    state = cluster(2)
    prompt = tokens(0, 1024)
    warm(state, "i0", prompt[:512])
    add_decoding(state, "i0", 100)
    # the product alone (the decode guard would filter i0 out before scoring it)
    decision = make_policy("lmetric", {"decode_slack": None}).decide(
        features(prompt), state.view(), 0.0
    )
    # i0: 512 uncached × (100 + 1); i1: 1024 × (0 + 1). Decoding adds no pending prefill.
    assert decision.score_table() == {"i0": 512 * 101, "i1": 1024 * 1}
    assert decision.instance_id == "i1"


def test_the_papers_ablations_compute_what_they_say():
    state = cluster(2)
    prompt = tokens(0, 1000)
    warm(state, "i0", prompt[:800])
    add_pending(state, "i1", 300)
    add_decoding(state, "i0", 2)  # BS 2 on i0; i1 runs its 300-token prefill, BS 1
    view = state.view()
    miss = make_policy("lmetric", {"prefill_term": "miss_ratio", "batch_offset": 0})
    scores = miss.decide(features(prompt), view, 0.0).score_table()
    assert scores == {"i0": (200 / 1000) * 2, "i1": 1.0 * 1}  # ignores i1's queue
    total = make_policy("lmetric", {"load_term": "total_tokens", "batch_offset": 1})
    context = view.decode_context_tokens
    scores = total.decide(features(prompt), view, 0.0).score_table()
    assert scores == {"i0": 200 * (context[0] + 0 + 1000), "i1": 1300 * (300 + 1000)}


def test_with_a_global_tier_the_tokens_it_holds_cost_a_load_not_a_prefill():
    """The holder of r's prefix has 1,000 tokens of prefill queued; an idle instance can
    load the prefix from the tier for 0.1 of a token each. Without the tier term (the
    paper's P-token) the idle instance is charged a full prefill and loses."""
    tier = GlobalTier()
    state = ClusterState(default_prefill_tps=10_000, global_tier=tier)
    for iid in ("i0", "i1"):
        state.add_instance(iid)
    prompt = tokens(0, 4096)
    warm(state, "i0", prompt)
    tier.insert(features(prompt).block_hashes)
    add_pending(state, "i0", 1_000)
    request = features(prompt)
    aware = make_policy("lmetric").decide(request, state.view(), 0.0)
    # i0: (1000 pending + 1 uncached) × (1 + 1); i1: 4096 − 4095 tier-held × 0.9 = 410.5
    assert aware.score_table() == pytest.approx({"i0": 1001 * 2, "i1": 410.5 * 1})
    assert aware.instance_id == "i1"
    blind = make_policy("lmetric", {"tier_token_cost": None}).decide(request, state.view(), 0.0)
    assert blind.score_table() == {"i0": 1001 * 2, "i1": 4096 * 1}
    assert blind.instance_id == "i0"


def test_the_decode_step_load_term_weighs_the_contexts_a_batch_decodes():
    """Two instances run four requests each: i0 decodes 30k-token contexts, i1 one-token
    ones, and i1 also has 20 tokens of prefill queued. ``BS + c`` sees equal batches and
    sends r to the shorter prefill queue, i0; the decode-step term charges i0 the KV reads
    of its long contexts (the step r would join there is 1.24× i1's) and sends r to i1."""
    state = cluster(2)
    add_decoding_context(state, "i0", 4, 30_000)
    add_decoding(state, "i1", 4)
    add_pending(state, "i1", 20)
    request = features(tokens(0, 100))
    fixed, seq = 397_100.0, 10_790.0
    costs = {"decode_fixed_tokens": fixed, "decode_seq_tokens": seq, "decode_slack": None}
    by_batch = make_policy("lmetric", costs).decide(request, state.view(), 0.0)
    assert by_batch.instance_id == "i0"
    step = make_policy("lmetric", {**costs, "load_term": "decode_step"})
    decision = step.decide(request, state.view(), 0.0)
    view = state.view()
    # i1's queued request counts too: it will decode there (KV pressure's committed batch)
    load = fixed + seq * (view.committed_batch + 1) + view.committed_context_tokens + 100
    p_tokens = view.p_tokens(request, tier_token_cost=0.1)
    assert decision.score_table() == pytest.approx(
        {"i0": p_tokens[0] * load[0], "i1": p_tokens[1] * load[1]}
    )
    assert decision.instance_id == "i1"
