"""Load generator: payloads, and real runs against a one-instance enginesim fleet."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

import engine_interface as ei
from devharness import scrape_total, wait_until
from enginesim.loadgen.payloads import PayloadBuilder
from enginesim.loadgen.runner import BurstSettings, LoadGenerator
from enginesim.replay.synth import AgenticParams, BurstParams, agentic_sessions, write_jsonl
from enginesim.replay.traces import TraceRecord, load_trace, read_trace, synthesize_tokens
from router_worker.routing import turn_index_from_messages
from tests.fleets import fast_fleet
from tests.replay.helpers import CONVERSATION

REPO = Path(__file__).resolve().parents[2]
MODEL = "Qwen/Qwen2-7B-Instruct"


@pytest.fixture(scope="module")
def target() -> Iterator[str]:
    """One simulated H20 at 20x speed (the engine's schedule is unchanged)."""
    with fast_fleet(1) as fleet:
        yield fleet.url(0)


def test_prefix_records_become_token_id_completions():
    record = TraceRecord(0, 0.0, 1000, 7, (1, 2), 512)
    path, body = PayloadBuilder("m").build(record)
    assert path == "/v1/completions"
    assert body["prompt"] == synthesize_tokens(record).tolist()
    assert body["max_tokens"] == 7 and body["ignore_eos"] and body["stream"]
    assert body["stream_options"] == {"include_usage": True}


def test_session_records_become_growing_chat_histories(tmp_path):
    path = tmp_path / "agentic.jsonl"
    write_jsonl(agentic_sessions(AgenticParams(sessions=3, mean_turns=5, seed=2)), path)
    builder = PayloadBuilder("m")
    sent: dict[str | None, list[list[dict]]] = {}
    for record in read_trace(path):
        route, body = builder.build(record)
        assert route == "/v1/chat/completions" and body["user"] == record.session_id
        sent.setdefault(record.session_id, []).append(body["messages"])
        assert turn_index_from_messages(body["messages"]) == record.turn
    for history in sent.values():
        for earlier, later in pairwise(history):
            assert later[: len(earlier)] == earlier  # earlier turns resent verbatim
            assert [m["role"] for m in later[len(earlier) :]] == ["assistant", "user"]


async def test_replays_a_real_trace_slice_and_measures_at_the_client(target):
    records = [
        r
        for r in load_trace(CONVERSATION, max_requests=14, rate_scale=10.0)
        if r.input_tokens + r.output_tokens < 32768
    ]  # the served model's context
    assert len(records) == 13
    outcomes = await LoadGenerator(records, target, MODEL).run()
    assert [o.status for o in outcomes] == ["ok"] * 13
    for outcome, record in zip(outcomes, records, strict=True):
        assert outcome.output_tokens == record.output_tokens
        assert outcome.prompt_tokens == record.input_tokens
        assert outcome.ttft_s is not None and outcome.end_s is not None
        assert 0 < outcome.ttft_s < outcome.end_s - outcome.sent_s + 1e-6
        assert outcome.scheduled_s == pytest.approx(record.arrival_s)
    assert sum(o.cached_tokens or 0 for o in outcomes) > 0  # block 0 is shared by every request


async def test_concurrency_limit_bounds_in_flight_requests(target):
    records = [TraceRecord(i, 0.0, 600, 40, (900_000 + i,), 512) for i in range(8)]
    outcomes = await LoadGenerator(records, target, MODEL, concurrency_limit=2).run()
    assert all(o.status == "ok" for o in outcomes)
    edges = sorted(
        [(o.sent_s, 1) for o in outcomes] + [(o.end_s, -1) for o in outcomes],
        key=lambda e: (e[0], e[1]),
    )
    assert max(np.cumsum([d for _, d in edges])) <= 2


async def test_stop_closes_streams_and_returns_promptly(target):
    records = [TraceRecord(0, 0.0, 600, 8000, (800_000,), 512)]  # ~3 s of decode
    generator = LoadGenerator(records, target, MODEL, loop=True)
    asyncio.get_running_loop().call_later(1.0, generator.stop)
    outcomes = await generator.run()
    assert outcomes and all(o.status in ("cancelled", "ok") for o in outcomes)
    cancelled = [o for o in outcomes if o.status == "cancelled"]
    assert cancelled and all(o.output_tokens < 8000 for o in cancelled)  # cut, not waited out


async def test_on_demand_burst_shares_one_prefix(target):
    records = [TraceRecord(0, 0.0, 100, 2, (1,), 512), TraceRecord(1, 1.5, 100, 2, (2,), 512)]
    params = BurstParams(
        duration_s=0.5, burst_rate=20.0, prefix_tokens=2048, suffix_tokens=50, output_tokens=2
    )
    generator = LoadGenerator(records, target, MODEL, burst=BurstSettings(params))
    asyncio.get_running_loop().call_later(0.2, generator.trigger_burst)
    outcomes = await generator.run()
    burst = [o for o in outcomes if o.kind == "burst"]
    assert len(burst) >= 3 and all(o.status == "ok" for o in burst)
    assert sum(o.cached_tokens or 0 for o in burst[1:]) >= 2048 * (len(burst) - 2)


def test_ctrl_c_stops_the_command_cleanly(target, tmp_path):
    out = tmp_path / "requests.jsonl"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "enginesim",
            "loadgen",
            "--trace",
            str(CONVERSATION),
            "--target",
            target,
            "--model",
            MODEL,
            "--loop",
            "--rate-scale",
            "5",
            "--out",
            str(out),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    done_before = scrape_total(target, ei.REQUEST_SUCCESS.total)
    assert proc.stdout.readline().startswith("# ")  # started: its first line is out
    # its handlers are installed before its first request: once the engine has answered
    # two, Ctrl-C meets a running load with requests behind it
    wait_until(
        lambda: scrape_total(target, ei.REQUEST_SUCCESS.total) >= done_before + 2,
        60,
        "the load generator's first requests answered",
        proc,
    )
    proc.send_signal(signal.SIGINT)
    stdout, _ = proc.communicate(timeout=15)
    assert "ttft_mean_s" in stdout  # the summary was printed
    assert out.read_text().count("\n") >= 1


def test_records_the_target_cannot_serve_are_skipped_and_reported(target):
    from enginesim.loadgen.cli import discover_model, fitting

    model, max_model_len = discover_model(target)
    assert (model, max_model_len) == (MODEL, 32768)
    records = [
        TraceRecord(index=i, arrival_s=0.0, input_tokens=n, output_tokens=100)
        for i, n in enumerate((1000, 32668, 32669, 120_000))
    ]
    assert [r.index for r in fitting(records, max_model_len)] == [0, 1]
    assert fitting(records, None) == records


def test_several_targets_share_the_requests_round_robin(target, tmp_path):
    """Two --target URLs (two names of one server, as a load balancer's backends): requests
    alternate between them and --out records which one served each."""
    other = target.replace("127.0.0.1", "localhost")
    out = tmp_path / "requests.jsonl"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "enginesim",
            "loadgen",
            "--trace",
            str(CONVERSATION),
            "--target",
            target,
            "--target",
            other,
            "--model",
            MODEL,
            "--rate-scale",
            "10",
            "--max-requests",
            "6",
            "--out",
            str(out),
            "--no-progress",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["target"] for row in rows] == [target, other] * 3
    assert all(row["status"] == "ok" for row in rows)
