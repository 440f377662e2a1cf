"""Synthetic generators: agentic sessions (Bailian format) and hotspot bursts."""

from __future__ import annotations

from itertools import pairwise

import numpy as np

from enginesim.replay.metrics import infinite_cache_hits
from enginesim.replay.synth import (
    AgenticParams,
    BurstParams,
    agentic_sessions,
    hotspot_burst,
    main,
)
from enginesim.replay.traces import read_trace, select
from tests.replay.helpers import CONVERSATION


def test_agentic_sessions_round_trip_through_the_bailian_reader(tmp_path):
    out = tmp_path / "agentic.jsonl"
    assert main(["agentic", "--sessions", "30", "--seed", "4", "--out", str(out)]) == 0
    records = read_trace(out)
    assert {r.hash_block_size for r in records} == {16}
    by_session: dict[str | None, list] = {}
    for record in records:
        by_session.setdefault(record.session_id, []).append(record)
    assert len(by_session) == 30
    for turns in by_session.values():
        assert [r.turn for r in turns] == list(range(len(turns)))
        for earlier, later in pairwise(turns):
            # context grows by the reply plus a new message, keeping the whole history
            assert later.input_tokens > earlier.input_tokens + earlier.output_tokens
            assert later.hash_ids[: len(earlier.hash_ids)] == earlier.hash_ids
            assert later.arrival_s >= earlier.arrival_s
    assert any(r.kind == "tool" for r in records)
    first_blocks = {r.hash_ids[0] for r in records}
    assert len(first_blocks) <= AgenticParams().system_prompts  # shared system prompts


def test_agentic_sessions_are_prefix_heavy_and_deterministic():
    params = AgenticParams(sessions=40, seed=9)
    rows = agentic_sessions(params)
    assert rows == agentic_sessions(params)
    assert rows != agentic_sessions(AgenticParams(sessions=40, seed=10))
    records = read_trace_rows(rows)
    ideal = infinite_cache_hits(records).sum() / sum(r.input_tokens for r in records)
    assert ideal > 0.7


def read_trace_rows(rows):
    from enginesim.replay.traces import TraceRecord

    return [
        TraceRecord(
            i,
            row["timestamp"],
            row["input_length"],
            row["output_length"],
            tuple(row["hash_ids"]),
            16,
        )
        for i, row in enumerate(rows)
    ]


def test_hotspot_burst_overlays_one_long_prefix_on_a_real_background():
    background = select(read_trace(CONVERSATION), end_s=120.0)
    params = BurstParams(at_s=30.0, duration_s=60.0, burst_rate=10.0, prefix_tokens=8192)
    merged = hotspot_burst(background, params)
    hot = [r for r in merged if r.kind == "hotspot"]
    assert len(merged) == len(background) + len(hot)
    assert 450 < len(hot) < 750  # Poisson, 10/s for 60 s
    assert all(30.0 <= r.arrival_s < 90.0 for r in hot)
    prefix = hot[0].hash_ids[:16]
    assert all(r.hash_ids[:16] == prefix for r in hot)
    background_ids = {h for r in background for h in r.hash_ids}
    assert not background_ids & set(prefix)
    assert np.all(np.diff([r.arrival_s for r in merged]) >= 0)
    in_window = [r for r in merged if 30.0 <= r.arrival_s < 90.0]
    assert len(hot) / len(in_window) > 0.7  # the hot prefix takes most of the traffic


def test_a_ramped_burst_starts_thin_and_reaches_its_rate():
    step = BurstParams(at_s=0.0, duration_s=200.0, burst_rate=10.0, seed=5)
    ramped = BurstParams(at_s=0.0, duration_s=200.0, burst_rate=10.0, ramp_s=100.0, seed=5)

    def arrivals(params, start, end):
        burst = [r for r in hotspot_burst([], params) if r.kind == "hotspot"]
        return sum(start <= r.arrival_s < end for r in burst)

    # the first 20 s of a 100 s ramp carry ~10% of the full rate; past the ramp, all of it
    assert arrivals(ramped, 0, 20) < 0.2 * arrivals(step, 0, 20)
    assert abs(arrivals(ramped, 100, 200) - arrivals(step, 100, 200)) <= 0.1 * arrivals(
        step, 100, 200
    )


def test_agentic_system_prompts_follow_a_zipf_popularity():
    params = AgenticParams(sessions=400, system_prompts=4, system_zipf=1.0, seed=2)
    rows = agentic_sessions(params)
    firsts = [row["hash_ids"][0] for row in rows if row["turn"] == 1]
    counts = sorted((firsts.count(h) for h in set(firsts)), reverse=True)
    # 1/k popularity over 4 prompts: 48%, 24%, 16%, 12%
    assert counts[0] > 1.6 * counts[1] and counts[1] > 1.5 * counts[3]
