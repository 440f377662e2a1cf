"""Trace shapes that tied a replay worker up: a one-session trace
of thousands of turns loads in linear time, and an idle stretch (a trace with a day
between two arrivals, or a tiny rate scale) is not scraped tick by tick."""

from __future__ import annotations

import pytest

from enginesim.replay import traces
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


class _CountingParents(dict[int, int]):
    """The parent map, counting the lookups a walk makes."""

    lookups = 0

    def get(self, key: int, default: int | None = None) -> int | None:  # type: ignore[override]
        self.lookups += 1
        return super().get(key, default)

    def __getitem__(self, key: int) -> int:
        self.lookups += 1
        return super().__getitem__(key)


def test_a_one_session_trace_resolves_in_linear_steps() -> None:
    turns = 3_000
    parent = _CountingParents({i: i - 1 if i > 1 else -1 for i in range(1, turns + 1)})
    roots: dict[int, int] = {}
    assert {traces._session_root(i, parent, roots) for i in range(1, turns + 1)} == {1}
    assert parent.lookups <= 4 * turns  # walked row by row: turns² / 2 lookups


def test_a_one_session_trace_loads_as_one_session() -> None:
    rows = [_row(i, i - 1 if i > 1 else -1, i * 0.1) for i in range(1, 3_001)]
    assert {r.session_id for r in read_bailian_rows(rows)} == {"chat-1"}


def test_sessions_resolve_as_before_and_a_cycle_ends() -> None:
    rows = [_row(1, -1, 0), _row(2, 1, 1), _row(3, -1, 2), _row(4, 2, 3), _row(5, 6, 4)]
    rows += [_row(6, 5, 5)]  # 5 and 6 name each other
    sessions = [r.session_id for r in read_bailian_rows(rows)]
    assert sessions[:4] == ["chat-1", "chat-1", "chat-3", "chat-1"]
    assert sessions[4] == sessions[5]


@pytest.mark.parametrize(("times", "rate_scale"), [((0, 20_000, 20_001), 1.0), ((0, 5, 9), 1e-3)])
def test_an_idle_stretch_is_not_scraped_second_by_second(times, rate_scale) -> None:
    """5.5 simulated hours between two arrivals (or a 9 s trace at a rate scale of 1/1000)
    took a scrape per simulated second; a day-long gap took hours of a worker."""
    records = select(
        read_bailian_rows([_row(i + 1, -1, t) for i, t in enumerate(times)]),
        rate_scale=rate_scale,
    )
    result = Simulator(records, "lmetric", SimConfig(instances=2), None).run()
    assert [r.status for r in result.requests] == ["ok"] * 3
    assert len(result.sample_times) < 100  # scrapes
