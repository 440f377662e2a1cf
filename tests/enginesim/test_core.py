"""Virtual-time tests of the engine core."""

from dataclasses import replace

import numpy as np
import pytest

from enginesim.engine import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EngineConfig,
    EngineCore,
    EngineRequestError,
    GlobalKVTier,
    KVEvent,
    StepBatch,
)


def make_engine(gpu="h20", model="qwen2-7b", sink=None, fast_forward=True, **overrides):
    return EngineCore(
        EngineConfig.for_hardware(gpu, model, **overrides),
        kv_event_sink=sink,
        fast_forward=fast_forward,
    )


def run(engine, arrivals, per_token=False, events_only=False):
    """Drive ``engine`` like the discrete-event simulator; arrivals = [(t, id, prompt, n)]."""
    pending = sorted(arrivals, key=lambda a: a[0])
    outputs: dict[str, list] = {}
    iterations = 0
    while pending or engine.has_unfinished_requests() or engine.next_event_time() is not None:
        iterations += 1
        next_engine = engine.next_event_time()
        if pending and (next_engine is None or pending[0][0] <= next_engine):
            t, req_id, prompt, max_tokens = pending.pop(0)
            engine.add_request(req_id, prompt, max_tokens, now=t)
            continue
        for out in engine.advance_to(next_engine, per_token=per_token, events_only=events_only):
            outputs.setdefault(out.req_id, []).append(out)
    return outputs, iterations


def workload(seed=0, n=60, shared=2048):
    rng = np.random.default_rng(seed)
    prefixes = [rng.integers(0, 150_000, shared) for _ in range(3)]
    arrivals, t = [], 0.0
    for i in range(n):
        t += rng.exponential(0.25)
        own = rng.integers(0, 150_000, int(rng.integers(1, 3000)))
        prompt = np.concatenate([prefixes[i % 3][: int(rng.integers(0, shared))], own])
        arrivals.append((t, f"r{i}", prompt, int(rng.integers(1, 400))))
    return arrivals


def finals(outputs):
    return {rid: outs[-1] for rid, outs in outputs.items()}


def test_every_request_finishes_once_with_exactly_max_tokens_and_causal_times():
    arrivals = workload()
    outputs, _ = run(make_engine(), arrivals, per_token=True)
    assert len(outputs) == len(arrivals)
    for arrival, req_id, _prompt, max_tokens in arrivals:
        outs = outputs[req_id]
        assert [o.finished for o in outs].count(True) == 1 and outs[-1].finished
        assert outs[-1].finish_reason == "length"
        assert sum(o.new_token_count for o in outs) == max_tokens == outs[-1].num_output_tokens
        times = np.concatenate([o.token_times for o in outs if o.token_times is not None])
        assert len(times) == max_tokens
        assert np.all(np.diff(times) > 0)
        assert arrival < outs[0].first_token_time == times[0]
        assert outs[-1].finish_time == times[-1]


def test_events_only_outputs_report_first_tokens_and_finishes_with_all_tokens():
    arrivals = workload(seed=3, n=30)
    full, _ = run(make_engine(), arrivals)
    events, _ = run(make_engine(), arrivals, events_only=True)
    for _, req_id, _, max_tokens in arrivals:
        outs = events[req_id]
        assert len(outs) <= 2 and outs[-1].finished
        assert sum(o.new_token_count for o in outs) == max_tokens
        assert outs[0].first_token_time == finals(full)[req_id].first_token_time
        assert outs[-1].finish_time == finals(full)[req_id].finish_time


def test_fast_forward_matches_step_by_step():
    arrivals = workload(seed=1, n=40)
    fast_engine = make_engine(num_gpu_blocks=800)
    fast, fast_iterations = run(fast_engine, arrivals)
    assert fast_engine.stats().num_preemptions >= 2  # the comparison covers preemption
    slow, _ = run(make_engine(num_gpu_blocks=800, fast_forward=False), arrivals)
    for req_id, out in finals(fast).items():
        ref = finals(slow)[req_id]
        assert out.first_token_time == pytest.approx(ref.first_token_time, rel=1e-9)
        assert out.finish_time == pytest.approx(ref.finish_time, rel=1e-9)
        assert out.num_cached_tokens == ref.num_cached_tokens
    total_tokens = sum(a[3] for a in arrivals)
    assert fast_iterations < total_tokens / 5


def test_decode_only_stretch_is_skipped_in_one_event():
    engine = make_engine()
    outputs, iterations = run(engine, [(0.0, "a", np.arange(100), 2000)])
    assert iterations <= 4
    assert engine.stats().num_steps == 2000
    assert outputs["a"][-1].num_output_tokens == 2000


def test_prefix_hit_lowers_ttft_by_the_prefill_it_skips():
    prompt = np.random.default_rng(2).integers(0, 150_000, 4096)
    engine = make_engine()
    first, _ = run(engine, [(0.0, "a", prompt, 4)])
    second, _ = run(engine, [(100.0, "b", prompt, 4)])
    a, b = first["a"][0], second["b"][0]
    cached = 4096 - 16  # the hit is capped at prompt length - 1, in whole blocks
    assert (a.num_cached_tokens, b.num_cached_tokens) == (0, cached)
    cost = engine.cost_model
    expected_saving = cost.prefill_time(4096) - cost.step_time(StepBatch.prefill(16, cached))
    saving = (a.first_token_time - 0.0) - (b.first_token_time - 100.0)
    assert saving == pytest.approx(expected_saving, rel=1e-9)
    assert b.first_token_time - 100.0 < 0.05 * (a.first_token_time - 0.0)
    stats = engine.stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (8192, cached)


def test_lru_eviction_at_capacity_removes_the_tail_of_the_oldest_prompt():
    events: list[KVEvent] = []
    engine = make_engine(sink=events.extend, num_gpu_blocks=64)
    rng = np.random.default_rng(3)
    prompt_a, prompt_b = rng.integers(0, 150_000, 512), rng.integers(0, 150_000, 768)
    run(engine, [(0.0, "a", prompt_a, 1), (10.0, "b", prompt_b, 1)])
    stored_a = next(e for e in events if isinstance(e, BlockStored))
    assert len(stored_a.block_hashes) == 32 and stored_a.parent_block_hash is None
    assert stored_a.token_ids == tuple(prompt_a.tolist())
    removed = [h for e in events if isinstance(e, BlockRemoved) for h in e.block_hashes]
    assert sorted(removed) == sorted(stored_a.block_hashes[16:])  # 48 needed, 32 were free
    again, _ = run(engine, [(20.0, "a2", prompt_a, 1)])
    assert again["a2"][0].num_cached_tokens == 16 * 16


def test_preemption_recomputes_the_newest_request_under_memory_pressure():
    rng = np.random.default_rng(4)
    arrivals = [
        (0.0, "old", rng.integers(0, 150_000, 160), 300),
        (0.001, "new", rng.integers(0, 150_000, 160), 300),
    ]
    engine = make_engine(num_gpu_blocks=40)
    outputs, _ = run(engine, arrivals)
    assert engine.stats().num_preemptions >= 1
    old, new = finals(outputs)["old"], finals(outputs)["new"]
    assert old.num_output_tokens == new.num_output_tokens == 300
    assert old.finish_time < new.finish_time
    unpressured, _ = run(make_engine(), arrivals)
    assert new.finish_time > finals(unpressured)["new"].finish_time
    slow, _ = run(make_engine(num_gpu_blocks=40, fast_forward=False), arrivals)
    assert finals(slow)["new"].finish_time == pytest.approx(new.finish_time, rel=1e-9)


def test_waiting_requests_are_admitted_fcfs_within_max_num_seqs():
    engine = make_engine(max_num_seqs=2)
    arrivals = [(0.001 * i, f"r{i}", np.arange(50) + 1000 * i, 20) for i in range(4)]
    outputs, _ = run(engine, arrivals)
    first_tokens = [finals(outputs)[f"r{i}"].first_token_time for i in range(4)]
    assert first_tokens == sorted(first_tokens)
    assert first_tokens[2] >= finals(outputs)["r0"].finish_time


def test_abort_finishes_a_request_early():
    engine = make_engine()
    engine.add_request("a", np.arange(200), 1000, now=0.0)
    engine.advance_to(0.5)
    assert engine.abort("a", now=0.5)
    out = engine.advance_to(0.6)
    assert len(out) == 1 and out[0].finished and out[0].finish_reason == "abort"
    assert 0 < out[0].num_output_tokens < 1000 and out[0].finish_time == 0.5
    assert not engine.has_unfinished_requests() and engine.next_event_time() is None
    assert engine.stats().kv_usage == 0.0


def test_requests_beyond_the_context_window_are_refused():
    engine = make_engine()
    with pytest.raises(EngineRequestError, match="maximum context length is 32768"):
        engine.add_request("long", np.zeros(32_000, dtype=int), 1000, now=0.0)
    with pytest.raises(EngineRequestError):
        engine.add_request("none", [1, 2, 3], 0, now=0.0)


def test_global_tier_loads_missing_blocks_instead_of_recomputing():
    prompt = np.random.default_rng(5).integers(0, 150_000, 8192)
    tier = GlobalKVTier(capacity_blocks=10_000, bandwidth=50e9)
    producer, consumer = (make_engine(global_tier=tier) for _ in range(2))
    run(producer, [(0.0, "p", prompt, 1)])
    outputs, _ = run(consumer, [(10.0, "c", prompt, 1)])
    out = outputs["c"][0]
    assert out.num_cached_tokens == 8192 - 16
    config = consumer.config
    transfer = (8192 - 16) * config.model.kv_bytes_per_token() / 50e9
    compute = consumer.cost_model.step_time(StepBatch(16, 1, 1, 16 * 8176 + 136, 8176))
    overhead = config.calibration.t_request
    assert out.first_token_time - 10.0 == pytest.approx(overhead + transfer + compute, rel=1e-9)
    assert out.num_tier_tokens == 8176
    stats = consumer.stats()
    assert stats.external_cache_hits == 8176 and stats.prefix_cache_hits == 0
    assert stats.tier_read_wait == 0.0 and stats.tier_read_time == transfer


def _tier_pair(tier_links=(0, 0)):
    """Two engines on one tier that holds two different 8192-token prompts."""
    rng = np.random.default_rng(6)
    prompts = [rng.integers(0, 150_000, 8192) for _ in range(2)]
    tier = GlobalKVTier(capacity_blocks=10_000, bandwidth=50e9)
    producer = make_engine(global_tier=tier)
    run(producer, [(0.0, "p0", prompts[0], 1), (0.0, "p1", prompts[1], 1)])
    config = EngineConfig.for_hardware("h20", "qwen2-7b", global_tier=tier)
    engines = [EngineCore(config, tier_link=link) for link in tier_links]
    return prompts, engines


def _first_tokens_together(prompts, engines):
    """Both engines get their prompt at t=10 and run their first step before either ends."""
    for k, (prompt, engine) in enumerate(zip(prompts, engines, strict=True)):
        engine.add_request(f"c{k}", prompt, 1, now=10.0)
    for engine in engines:
        engine.advance_to(10.0)
    return [engine.advance_to(60.0)[0].first_token_time - 10.0 for engine in engines]


def test_concurrent_tier_reads_share_the_link():
    prompts, engines = _tier_pair()
    first, second = _first_tokens_together(prompts, engines)
    transfer = (8192 - 16) * engines[0].config.model.kv_bytes_per_token() / 50e9
    # the second engine's read queues behind the first one's, all of it
    assert second - first == pytest.approx(transfer, rel=1e-9)
    stats = [engine.stats() for engine in engines]
    assert stats[0].tier_read_wait == 0.0
    assert stats[1].tier_read_wait == pytest.approx(transfer, rel=1e-9)
    assert stats[1].tier_read_time == pytest.approx(2 * transfer, rel=1e-9)
    assert (
        stats[0].tier_bytes_read
        == stats[1].tier_bytes_read
        == 8176 * (engines[0].config.model.kv_bytes_per_token())
    )
    assert stats[0].has_tier and stats[1].external_cache_hits == 8176


def test_tier_reads_over_separate_links_do_not_wait():
    prompts, engines = _tier_pair(tier_links=(0, 1))
    first, second = _first_tokens_together(prompts, engines)
    assert first == second
    assert all(engine.stats().tier_read_wait == 0.0 for engine in engines)


def test_reset_prefix_cache_emits_all_blocks_cleared():
    events: list[KVEvent] = []
    engine = make_engine(sink=events.extend)
    run(engine, [(0.0, "a", np.arange(64), 2)])
    assert engine.reset_prefix_cache()
    assert isinstance(events[-1], AllBlocksCleared)
    again, _ = run(engine, [(1.0, "b", np.arange(64), 2)])
    assert again["b"][0].num_cached_tokens == 0


def test_stats_report_vllm_style_counters():
    engine = make_engine()
    run(engine, [(0.0, "a", np.arange(300), 7), (0.0, "b", np.arange(300), 5)])
    stats = engine.stats()
    assert stats.generation_tokens == 12 and stats.prompt_tokens == 600
    assert stats.num_running == stats.num_waiting == 0
    assert stats.num_gpu_blocks == engine.config.num_gpu_blocks and stats.block_size == 16
    assert stats.busy_time > 0


def test_small_gpus_get_vllm_small_defaults():
    cfg = EngineConfig.for_hardware("l40s", "qwen3-8b")
    assert (cfg.max_num_batched_tokens, cfg.max_num_seqs) == (2048, 256)
    big = replace(
        cfg,
        gpu=EngineConfig.for_hardware("h100", "qwen3-8b").gpu,
        max_num_batched_tokens=0,
        max_num_seqs=0,
        num_gpu_blocks=0,
    )
    assert (big.max_num_batched_tokens, big.max_num_seqs) == (8192, 1024)


def test_the_a100_gets_the_small_defaults_despite_its_80_gb():
    """vLLM (since PR 17885) keeps 2048 tokens / 256 seqs on the A100: larger chunks
    slowed it down."""
    cfg = EngineConfig.for_hardware("a100", "qwen3-32b")
    assert cfg.gpu.memory_bytes >= 70 * 2**30
    assert (cfg.max_num_batched_tokens, cfg.max_num_seqs) == (2048, 256)


def test_known_output_blocks_are_cached_for_the_next_turn():
    """With the answer's token ids given, its full blocks enter the prefix cache as they
    are computed (vLLM caches decode blocks too); without them only the prompt's do."""
    rng = np.random.default_rng(11)
    prompt, answer = rng.integers(0, 150_000, 100), rng.integers(0, 150_000, 64)
    follow_up = np.concatenate([prompt, answer, rng.integers(0, 150_000, 20)])
    hits = {}
    for known in (True, False):
        engine = make_engine()
        engine.add_request("a", prompt, 64, now=0.0, output_token_ids=answer if known else None)
        engine.advance_to(100.0)
        engine.add_request("b", follow_up, 1, now=100.0)
        outputs = engine.advance_to(200.0)
        hits[known] = next(o for o in outputs if o.req_id == "b").num_cached_tokens
    assert hits[True] == (100 + 64 - 1) // 16 * 16  # the last token's KV is never computed
    assert hits[False] == 100 // 16 * 16
    with pytest.raises(EngineRequestError, match="output_token_ids"):
        make_engine().add_request("c", prompt, 64, now=0.0, output_token_ids=answer[:10])


def test_the_inter_token_latency_totals_are_the_gaps_between_each_requests_tokens():
    # vllm:inter_token_latency_seconds: every token after a request's first observes the
    # time since the one before; over a whole run the sum is each request's last token
    # minus its first, the count its tokens after the first.
    engine = make_engine()
    outputs, _ = run(engine, workload(n=30), per_token=True)
    ends = finals(outputs)
    total = sum(o.last_token_time - o.first_token_time for o in ends.values())
    count = sum(o.num_output_tokens - 1 for o in ends.values())
    last = max(o.last_token_time for o in ends.values())
    assert engine.itl_totals(last) == (pytest.approx(total), count)
    assert count > 1000  # the run decoded


def test_the_inter_token_latency_totals_count_a_lazy_decode_stretch_as_it_runs():
    # Two engines run the same requests; one is advanced to each instant, the other is
    # only read then: a decode-only stretch it has not run yet counts as if it had.
    arrivals = [(0.0, f"r{k}", np.arange(k * 1000, k * 1000 + 500), 300) for k in range(8)]
    ran, read = make_engine(), make_engine()
    for engine in (ran, read):
        for t, req_id, prompt, max_tokens in arrivals:
            engine.add_request(req_id, prompt, max_tokens, now=t)
        now = 0.0
        while engine.next_event_time() - now < 1.0:  # step by step through the prefills
            now = engine.next_event_time()
            engine.advance_to(now)
    start, horizon = read.itl_totals(now), read.next_event_time()
    instants = [now + (horizon - now) * f for f in (0.2, 0.5, 0.9)]  # within the stretch
    for now in instants:
        ran.advance_to(now)
        committed = ran.itl_totals(now)
        assert read.itl_totals(now) == (pytest.approx(committed[0]), committed[1])
    counts = [read.itl_totals(now)[1] for now in instants]
    assert start[1] < counts[0] < counts[1] < counts[2]
