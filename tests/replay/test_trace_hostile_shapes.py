"""Trace shapes that tied a replay worker up (issue 61, items 5 and 6): a one-session trace
of thousands of turns loads in linear time, and an idle stretch (a trace with a day
between two arrivals, or a tiny rate scale) is not scraped tick by tick."""

from __future__ import annotations

import time

import pytest

from enginesim.replay.simulator import SimConfig, Simulator
from enginesim.replay.traces import read_bailian_rows, select


def _row(chat_id: int, parent: int, at: float) -> dict:
    return {
        "chat_id": chat_id,
        "parent_chat_id": parent,
        "timestamp": at,
        "input_length": 64,
        "output_length": 4,
        "hash_ids": [chat_id],
        "type": "text",
        "turn": 1,
    }


def test_a_one_session_trace_loads_in_linear_time() -> None:
    rows = [_row(i, i - 1 if i > 1 else -1, i * 0.1) for i in range(1, 12_001)]
    started = time.perf_counter()
    records = read_bailian_rows(rows)
    took = time.perf_counter() - started
    assert {r.session_id for r in records} == {"chat-1"}
    assert took < 1.5, f"{took:.2f} s for 12k turns of one session"  # quadratic: ~15 s


def test_sessions_resolve_as_before_and_a_cycle_ends() -> None:
    rows = [_row(1, -1, 0), _row(2, 1, 1), _row(3, -1, 2), _row(4, 2, 3), _row(5, 6, 4)]
    rows += [_row(6, 5, 5)]  # 5 and 6 name each other
    sessions = [r.session_id for r in read_bailian_rows(rows)]
    assert sessions[:4] == ["chat-1", "chat-1", "chat-3", "chat-1"]
    assert sessions[4] == sessions[5]


@pytest.mark.parametrize(("times", "rate_scale"), [((0, 1e8, 1e8 + 1), 1.0), ((0, 5, 9), 1e-7)])
def test_an_idle_stretch_is_not_scraped_second_by_second(monkeypatch, times, rate_scale) -> None:
    scrapes = {"n": 0}
    scrape = Simulator._on_scrape

    def counted(self, payload):
        scrapes["n"] += 1
        if scrapes["n"] > 10_000:
            raise AssertionError("a scrape per simulated second of an idle stretch")
        scrape(self, payload)

    monkeypatch.setattr(Simulator, "_on_scrape", counted)
    records = select(
        read_bailian_rows([_row(i + 1, -1, t) for i, t in enumerate(times)]),
        rate_scale=rate_scale,
    )
    result = Simulator(records, "lmetric", SimConfig(instances=2), None).run()
    assert [r.status for r in result.requests] == ["ok"] * 3
    assert scrapes["n"] < 200
