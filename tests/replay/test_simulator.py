"""Simulator: conservation, causality, an exact hand-computed TTFT, determinism,
faults, staleness, the lower bound, and a policy difference that must show."""

from __future__ import annotations

import numpy as np
import pytest

from enginesim.engine import StepBatch
from enginesim.replay import metrics
from enginesim.replay.simulator import Fault, SimConfig, Simulator
from enginesim.replay.traces import TraceRecord, load_trace, read_trace
from tests.replay.helpers import CONVERSATION, SYNTHETIC

LONG = 131072  # Mooncake prompts reach 125k tokens


@pytest.fixture(scope="module")
def conversation_slice():
    # 240 real requests (80 s of trace) replayed 3x faster on 4 instances: a busy cluster.
    return load_trace(CONVERSATION, max_requests=240, rate_scale=3.0)


@pytest.fixture(scope="module")
def lmetric_run(conversation_slice):
    return Simulator(
        conversation_slice, "lmetric", SimConfig(instances=4, max_model_len=LONG)
    ).run()


def test_conservation_and_causality(conversation_slice, lmetric_run):
    results = lmetric_run.requests
    assert [r.id for r in results] == [f"r{i}" for i in range(len(conversation_slice))]
    for record, result in zip(conversation_slice, results, strict=True):
        assert result.status == "ok"
        assert result.output_tokens == result.output_tokens_asked == max(record.output_tokens, 1)
        assert result.prompt_tokens == record.input_tokens
        assert 0 <= result.arrival_s < result.first_token_s <= result.finish_s
        assert 0 <= result.cached_tokens < result.prompt_tokens
        assert result.attempts == 1
    assert lmetric_run.pending_samples.min() >= -1e-9


def test_exact_ttft_of_a_tiny_scenario():
    """A (4000 tokens) at t=0 and B at t=0.01 on one idle H20; B shares A's first 2048
    tokens (4 blocks of 512). A prefills alone in step 1; B is admitted when step 1 ends,
    finds A's 2048 tokens cached and prefills 952 new ones beside A's first decode."""
    a = TraceRecord(0, 0.0, 4000, 5, (0, 1, 2, 3, 4, 5, 6, 7), 512)
    b = TraceRecord(1, 0.01, 3000, 5, (0, 1, 2, 3, 50, 51), 512)
    sim = Simulator([a, b], "round_robin", SimConfig(instances=1, scrape_interval_s=0))
    cost = sim.engine_config.cost_model()
    step1 = cost.step_time(StepBatch.prefill(4000))
    step2 = cost.step_time(StepBatch.from_requests([1, 952], [4000, 2048], 2))
    overhead = sim.engine_config.calibration.t_request  # A's step 1 starts after it
    ra, rb = sim.run().requests
    assert ra.first_token_s == pytest.approx(overhead + step1, rel=1e-12)
    assert rb.cached_tokens == 2048 and rb.first_token_s is not None
    assert rb.first_token_s - rb.arrival_s == pytest.approx(
        overhead + step1 + step2 - 0.01, rel=1e-12
    )


def test_same_seed_same_results(conversation_slice):
    records = conversation_slice[:120]
    config = SimConfig(instances=4, max_model_len=LONG, seed=3)
    first = Simulator(records, "cache_aware", config).run()
    second = Simulator(records, "cache_aware", config).run()
    assert [r.to_json() for r in first.requests] == [r.to_json() for r in second.requests]
    assert np.array_equal(first.pending_samples, second.pending_samples)


def test_cache_aware_policy_beats_round_robin_on_hits():
    # Requests 3000-3299 of the synthetic trace: 36% of their prompt tokens repeat an
    # earlier prefix inside the window (its first 300 requests: only 5%).
    start = read_trace(SYNTHETIC)[3000].arrival_s
    records = load_trace(SYNTHETIC, start_s=start, max_requests=300)
    ideal = metrics.lower_bound_summary(records, SimConfig().engine_config(None))[0]["hit_ratio"]
    assert ideal > 0.3
    config = SimConfig(instances=8, max_model_len=LONG)
    hit = {
        p: metrics.summarize(Simulator(records, p, config).run())["hit_ratio"]
        for p in ("round_robin", "cache_aware", "lmetric")
    }
    assert hit["cache_aware"] > hit["round_robin"] + 0.05
    assert hit["lmetric"] > hit["round_robin"]


def test_no_request_beats_the_lower_bound(conversation_slice, lmetric_run):
    sim_config = SimConfig(instances=4, max_model_len=LONG)
    bound = metrics.ttft_lower_bound(conversation_slice, sim_config.engine_config(None))
    ttft = np.array([r.first_token_s - r.arrival_s for r in lmetric_run.requests])
    assert np.all(ttft >= bound - 1e-9)
    assert ttft.mean() > bound.mean()


def test_infinite_cache_hits_by_hand():
    records = [
        TraceRecord(0, 0.0, 1000, 1, (1, 2), 512),  # block 2 holds 488 tokens
        TraceRecord(1, 1.0, 1024, 1, (1, 2), 512),  # 512 + 488 cached
        TraceRecord(2, 2.0, 1536, 1, (1, 2, 3), 512),  # 1024 cached
        TraceRecord(3, 3.0, 700, 1, (9, 2), 512),
    ]  # other parent: nothing
    assert metrics.infinite_cache_hits(records).tolist() == [0, 1000, 1024, 0]


def test_lower_bound_counts_only_requests_an_engine_accepts():
    config = SimConfig(max_model_len=4096).engine_config(None)
    fits = [TraceRecord(0, 0.0, 1000, 8, (1, 2), 512), TraceRecord(2, 2.0, 1024, 8, (1, 2), 512)]
    too_long = TraceRecord(1, 1.0, 4090, 8, (1, 2, 3, 4, 5, 6, 7, 8), 512)  # 4098 > 4096
    assert metrics.servable([fits[0], too_long, fits[1]], config) == fits
    summary, _ = metrics.lower_bound_summary([fits[0], too_long, fits[1]], config)
    assert (summary["requests"], summary["completed"]) == (3, 2)
    assert summary == {**metrics.lower_bound_summary(fits, config)[0], "requests": 3}


def test_failure_retries_unstarted_requests_elsewhere(conversation_slice):
    records = conversation_slice[:150]
    fail_at = 10.0
    config = SimConfig(instances=4, max_model_len=LONG, faults=(Fault(fail_at, 1, "fail"),))
    results = Simulator(records, "least_load", config).run().requests
    assert all(r.status in ("ok", "failed") for r in results)
    assert any(r.attempts == 2 and r.status == "ok" for r in results)
    for r in results:
        if r.arrival_s > fail_at or r.attempts > 1:
            assert r.instance != "i1"
        if r.status == "failed":  # it was streaming when i1 died
            assert r.instance == "i1" and r.first_token_s is not None
            assert r.first_token_s <= fail_at == r.finish_s


def test_drain_then_restore(conversation_slice):
    records = conversation_slice[:150]
    faults = (Fault(5.0, 2, "drain"), Fault(15.0, 2, "restore"))
    config = SimConfig(instances=4, max_model_len=LONG, faults=faults)
    results = Simulator(records, "round_robin", config).run().requests
    assert all(r.status == "ok" for r in results)
    during = [r.instance for r in results if 5.0 <= r.arrival_s < 15.0]
    after = [r.instance for r in results if r.arrival_s >= 15.0]
    assert during and "i2" not in during
    assert "i2" in after


def test_stale_telemetry_changes_decisions_not_conservation(conversation_slice):
    records = conversation_slice[:150]
    config = SimConfig(instances=4, max_model_len=LONG, telemetry_delay_s=5.0)
    stale = Simulator(records, "lmetric", config).run().requests
    fresh = Simulator(records, "lmetric", SimConfig(instances=4, max_model_len=LONG)).run().requests
    assert all(r.status == "ok" and r.output_tokens == r.output_tokens_asked for r in stale)
    assert [r.instance for r in stale] != [r.instance for r in fresh]


def test_too_long_requests_are_rejected_and_counted():
    records = [TraceRecord(0, 0.0, 40000, 4), TraceRecord(1, 0.5, 100, 4)]
    result = Simulator(records, "least_load", SimConfig(instances=2)).run()  # 32k context
    assert [r.status for r in result.requests] == ["rejected", "ok"]
    assert metrics.summarize(result)["rejected"] == 1


def test_kv_events_and_global_tier_run_cleanly(conversation_slice):
    records = conversation_slice[:100]
    config = SimConfig(instances=4, max_model_len=LONG, kv_events=True, global_tier_blocks=200_000)
    result = Simulator(records, "smetric", config).run()
    assert all(r.status == "ok" for r in result.requests)
    assert metrics.summarize(result)["hit_ratio"] > 0


def _tier_run(records, **tier):
    config = SimConfig(instances=4, max_model_len=LONG, global_tier_blocks=200_000, **tier)
    return Simulator(records, "round_robin", config).run()


def test_tier_traffic_is_reported_per_run_instance_and_request(conversation_slice):
    result = _tier_run(conversation_slice[:120])
    summary = metrics.summarize(result)
    tier = summary["tier"]
    kv_bytes = SimConfig().engine_config(None).model.kv_bytes_per_token()
    assert tier["hit_tokens"] > 0 and tier["bytes_read"] == tier["hit_tokens"] * kv_bytes
    per_request = sum(r.tier_tokens for r in result.requests if r.status == "ok")
    assert 0 < per_request <= tier["hit_tokens"]
    assert tier["hit_ratio"] == per_request / sum(
        r.prompt_tokens for r in result.requests if r.status == "ok"
    )
    assert sum(i["bytes_read"] for i in tier["per_instance"].values()) == tier["bytes_read"]
    assert all(r.cached_tokens >= r.tier_tokens for r in result.requests)
    assert "tier_tokens" in result.requests[0].to_json()
    assert 0 <= tier["read_wait_s"] <= tier["read_time_s"]


def test_tier_reads_wait_on_a_shared_link_and_not_on_private_ones(conversation_slice):
    shared = _tier_run(conversation_slice, global_tier_bandwidth=2e9).tier
    private = _tier_run(
        conversation_slice, global_tier_bandwidth=2e9, global_tier_link_instances=1
    ).tier
    assert shared.read_wait_s > 0 and private.read_wait_s == 0.0
    assert private.read_time_s > 0


def test_no_tier_no_tier_report(lmetric_run):
    assert lmetric_run.tier is None
    assert "tier" not in metrics.summarize(lmetric_run)
    assert "tier_tokens" not in lmetric_run.requests[0].to_json()


def test_a_policy_with_cost_coefficients_gets_the_simulated_clusters():
    from enginesim.replay.policy_costs import derive_coefficients

    record = TraceRecord(0, 0.0, 100, 2)
    h100 = Simulator([record], "predicted_ttft", SimConfig(instances=1, gpu="h100"))
    assert h100.policy.params.prefill_tps == derive_coefficients("h100", "qwen2-7b")["prefill_tps"]
    chosen = SimConfig(
        instances=1, gpu="h100", policy_params={"predicted_ttft": {"prefill_tps": 1234.0}}
    )
    kept = Simulator([record], "predicted_ttft", chosen)
    assert kept.policy.params.prefill_tps == 1234.0  # what was set is kept
    assert kept.policy.params.min_step_s == h100.policy.params.min_step_s


def test_finished_requests_report_their_output_length_to_the_policy():
    """observe_finish reaches the policy at each finish: Preble's decode cost becomes the
    mean output length (5, 10, 30 tokens → 15) × its decode_token_weight."""
    records = [TraceRecord(k, 0.1 * k, 200, out) for k, out in enumerate((5, 10, 30))]
    sim = Simulator(records, "preble", SimConfig(instances=2))
    assert sim.policy.decode_cost == 128  # the prior, before any finish
    sim.run()
    assert sim.policy.decode_cost == pytest.approx(15 * sim.policy.params.decode_token_weight)


def test_requests_keep_what_predicted_ttft_predicted_for_them():
    records = [TraceRecord(k, 0.5 * k, 400 + 100 * k, 4) for k in range(6)]
    predicted = Simulator(records, "predicted_ttft", SimConfig(instances=2)).run()
    for request in predicted.requests:
        assert request.predicted_ttft_s is not None and request.predicted_ttft_s > 0
        assert request.to_json()["predicted_ttft_s"] == request.predicted_ttft_s
    # an idle engine: the prediction is the cost model's prefill, below the engine's TTFT
    # by its fixed per-request overhead, and close to it
    first = predicted.requests[0]
    assert first.predicted_ttft_s is not None
    assert 0.5 < first.predicted_ttft_s / metrics.ttft_of(first) < 1.0
    others = Simulator(records, "lmetric", SimConfig(instances=2)).run()
    assert all("predicted_ttft_s" not in r.to_json() for r in others.requests)


def test_the_engines_kv_capacity_is_a_replay_setting():
    """vLLM's --gpu-memory-utilization, or the KV blocks live engines report (the control
    plane replays a cluster on those): the simulated engines get that many blocks."""
    default = SimConfig().engine_configs(None)[0].num_gpu_blocks
    half = SimConfig(gpu_memory_utilization=0.5).engine_configs(None)[0].num_gpu_blocks
    assert 0 < half < default
    assert SimConfig(num_gpu_blocks=5000).engine_configs(None)[0].num_gpu_blocks == 5000
    assert SimConfig(num_gpu_blocks=5000).engine_config(None).num_gpu_blocks == 5000
