"""llm-d's two shipped paths (``llmd``, ``llmd_precise``) on hand-built clusters; every
expected score is worked out by hand from the rules in the policy's docstring."""

import pytest

from enginesim.replay.policy_costs import derive_coefficients, fill_coefficients
from router_worker.routing import ClusterState, make_policy

from .helpers import add_pending, cluster, features, tokens, warm


def scrape(state, instance_id, *, waiting, kv_usage):
    state.on_scrape(instance_id, 0.0, running=0, waiting=waiting, kv_usage=kv_usage)


# ----- llmd: the default profile, 2 · queue + 2 · KV + 3 · prefix --------------------


def test_default_profile_sums_the_three_scorers_with_llmds_weights():
    state = cluster(3)
    prompt = tokens(0, 64)  # 4 blocks of 16
    scrape(state, "i0", waiting=4, kv_usage=0.5)  # queue 0,   KV 0.5, prefix 0
    scrape(state, "i1", waiting=0, kv_usage=0.9)  # queue 1,   KV 0.1, prefix 4/4
    scrape(state, "i2", waiting=2, kv_usage=0.1)  # queue 0.5, KV 0.9, prefix 2/4
    warm(state, "i1", prompt)
    warm(state, "i2", prompt[:32])
    decision = make_policy("llmd").decide(features(prompt), state.view(), 0.0)
    assert decision.score_table() == pytest.approx(
        {"i0": -(0 + 2 * 0.5 + 0), "i1": -(2 + 2 * 0.1 + 3), "i2": -(1 + 2 * 0.9 + 1.5)}
    )
    assert decision.instance_id == "i1"


def test_prefix_scorer_counts_full_blocks_up_to_the_cap():
    state = cluster(3)
    prompt = tokens(0, 70)  # 4 full blocks (the 6-token tail is not hashed)
    warm(state, "i0", prompt[:16])
    warm(state, "i1", prompt)
    only_prefix = {"queue_weight": 0, "kv_cache_weight": 0, "max_prefix_blocks": 2}
    decision = make_policy("llmd", only_prefix).decide(features(prompt), state.view(), 0.0)
    assert decision.score_table() == pytest.approx({"i0": -1.5, "i1": -3.0, "i2": 0.0})


def test_equal_queues_all_score_one_and_the_kv_scorer_decides():
    state = cluster(2)
    scrape(state, "i0", waiting=3, kv_usage=0.2)
    scrape(state, "i1", waiting=3, kv_usage=0.6)
    decision = make_policy("llmd").decide(features(tokens(0, 40)), state.view(), 0.0)
    assert decision.score_table() == pytest.approx({"i0": -(2 + 1.6), "i1": -(2 + 0.8)})
    assert decision.instance_id == "i0"


def test_a_never_scraped_engine_reads_an_empty_queue_and_an_empty_cache():
    state = cluster(2)
    scrape(state, "i0", waiting=1, kv_usage=0.3)
    decision = make_policy("llmd").decide(features(tokens(0, 40)), state.view(), 0.0)
    assert decision.score_table() == pytest.approx({"i0": -(0 + 1.4), "i1": -(2 + 2)})


def test_default_profile_ignores_load_the_scrape_has_not_seen():
    """llm-d reads the waiting queue as scraped: a burst dispatched since the last scrape
    does not move the queue scorer (what a router of ours accounts for at once)."""
    state = cluster(2)
    scrape(state, "i0", waiting=0, kv_usage=0.0)
    scrape(state, "i1", waiting=0, kv_usage=0.0)
    for _ in range(3):
        add_pending(state, "i0", 4000)
    decision = make_policy("llmd").decide(features(tokens(0, 40)), state.view(), 0.0)
    assert decision.score_table() == pytest.approx({"i0": -4.0, "i1": -4.0})


# ----- llmd_precise: affinity filter, TTFT gate, token load ---------------------------

PROMPT = tokens(100_000, 160)  # 10 blocks


def precise_cluster(sticky_pending: tuple[int, int]) -> ClusterState:
    """i0 holds the whole prompt, i1 8 of its 10 blocks (0.8: sticky), i2 none; i0 and i1
    have ``sticky_pending`` prefill tokens queued, i2 nothing."""
    state = cluster(3)
    warm(state, "i0", PROMPT)
    warm(state, "i1", PROMPT[:128])
    add_pending(state, "i0", sticky_pending[0])
    add_pending(state, "i1", sticky_pending[1])
    return state


def test_precise_path_keeps_the_sticky_instances_and_picks_the_lower_token_load():
    state = precise_cluster((20_000, 10_000))
    # queue delays at 1000 tok/s: 20 s, 10 s, 0 s; 10 − 0 ≤ 18 s: the gate stays shut
    policy = make_policy("llmd_precise", {"prefill_tps": 1000.0})
    decision = policy.decide(features(PROMPT), state.view(), 0.0)
    assert decision.reason == "sticky"
    threshold = 4_194_304
    # i0: 20 000 queued + 1 token (the last is always recomputed); i1: 10 000 + 32
    assert decision.score_table() == pytest.approx(
        {"i0": -(1 - 20_001 / threshold), "i1": -(1 - 10_032 / threshold), "i2": None}
    )
    assert decision.instance_id == "i1"


def test_precise_path_opens_the_gate_when_the_sticky_queue_is_too_long():
    state = precise_cluster((20_000, 10_000))
    # at 500 tok/s: 40 s, 20 s, 0 s; 20 − 0 > 18 s: every instance is considered
    policy = make_policy("llmd_precise", {"prefill_tps": 500.0})
    decision = policy.decide(features(PROMPT), state.view(), 0.0)
    assert decision.reason == "load_override"
    assert decision.instance_id == "i2"  # 0 queued + 160 uncached


def test_precise_path_without_a_sticky_instance_weighs_only_token_load():
    state = cluster(3)
    warm(state, "i0", PROMPT[:112])  # 7 of 10 blocks: below 0.8
    add_pending(state, "i2", 100)
    decision = make_policy("llmd_precise").decide(features(PROMPT), state.view(), 0.0)
    assert decision.reason == "no_sticky"
    threshold = 4_194_304
    assert decision.score_table() == pytest.approx(
        {"i0": -(1 - 48 / threshold), "i1": -(1 - 160 / threshold), "i2": -(1 - 260 / threshold)}
    )
    assert decision.instance_id == "i0"


def test_token_load_saturates_at_its_threshold_and_ties_go_to_the_seeded_random():
    state = cluster(2)
    add_pending(state, "i0", 2000)
    add_pending(state, "i1", 1500)
    params = {"queue_threshold_tokens": 1000}
    chosen = {
        make_policy("llmd_precise", params, seed=s)
        .decide(features(tokens(0, 40)), state.view(), 0.0)
        .instance_id
        for s in range(30)
    }
    assert chosen == {"i0", "i1"}  # both loads past 1000: both score 0


def test_peak_prefill_rate_is_derived_for_known_hardware_and_kept_when_set():
    derived = fill_coefficients("llmd_precise", {}, "h20", "qwen2-7b")
    assert derived == {"prefill_tps": derive_coefficients("h20", "qwen2-7b")["prefill_tps"]}
    assert fill_coefficients("llmd_precise", {"prefill_tps": 5.0}, "h20", "qwen2-7b") == {
        "prefill_tps": 5.0
    }
    # unknown hardware: left blank, and the policy uses llm-d's own default
    assert fill_coefficients("llmd_precise", {}, "no-such-gpu", "qwen2-7b") == {}
