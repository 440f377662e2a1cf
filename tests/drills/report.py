"""Drill results: one row per scenario, merged into ``test-artifacts/drills.json``.

Each drill counts what its clients saw: ``sent`` requests, ``succeeded`` ones, ones that
``failed_clear`` (an OpenAI-style error body, or a stream ended by an SSE error event and
``[DONE]``) and ``lost`` ones (anything else: a cut connection, a hung or truncated stream,
an unparseable answer). ``recovery_s`` is the scenario's own recovery measure (named in
``notes``). ``audit_events_lost`` (audit rows or router events that never reached Postgres)
and ``judgements_skipped`` (canary judgements the judge could not make) are None where a
drill does not measure them (the table shows "-"); the goal is 0 wherever they are measured.
``bench/drills/run.py`` prints the table; a drills run that passes publishes it in the
README (bench/drills/table.py). Each row names the test that recorded it and the machine.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.drills.table import RESULTS, machine


@dataclass
class Outcome:
    sent: int = 0
    succeeded: int = 0
    failed_clear: int = 0
    lost: int = 0
    lost_examples: list[str] = field(default_factory=list)
    clear_kinds: dict[str, int] = field(default_factory=dict)
    audit_events_lost: int | None = None  # None: not measured by this drill
    judgements_skipped: int | None = None

    def add(self, verdict: str, detail: str = "") -> None:
        self.sent += 1
        if verdict == "clear":
            kind = detail.split(":", 1)[0][:40]
            self.clear_kinds[kind] = self.clear_kinds.get(kind, 0) + 1
        if verdict == "ok":
            self.succeeded += 1
        elif verdict == "clear":
            self.failed_clear += 1
        else:
            self.lost += 1
            if len(self.lost_examples) < 5:
                self.lost_examples.append(detail[:300])

    def merge(self, other: Outcome) -> None:
        self.sent += other.sent
        self.succeeded += other.succeeded
        self.failed_clear += other.failed_clear
        self.lost += other.lost
        self.lost_examples += other.lost_examples
        for kind, count in other.clear_kinds.items():
            self.clear_kinds[kind] = self.clear_kinds.get(kind, 0) + count
        self.audit_events_lost = _sum(self.audit_events_lost, other.audit_events_lost)
        self.judgements_skipped = _sum(self.judgements_skipped, other.judgements_skipped)


def _sum(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else a + b


def record(
    scenario: str, outcome: Outcome, recovery_s: float | None, notes: str = "", **extra: Any
) -> None:
    """Merge one drill's row into the results file (safe for concurrent writers)."""
    RESULTS.parent.mkdir(exist_ok=True)
    row = {
        "scenario": scenario,
        **asdict(outcome),
        "recovery_s": None if recovery_s is None else round(recovery_s, 2),
        "notes": notes,
        "at": time.strftime("%Y-%m-%d %H:%M:%S"),
        "test": current_test(),
        "machine": machine(),
        **extra,
    }
    with open(RESULTS.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        rows = load()
        rows[scenario] = row
        RESULTS.write_text(json.dumps(rows, indent=2))


def current_test() -> str | None:
    """The node id of the test running in this process (pytest sets it for each phase)."""
    current = os.environ.get("PYTEST_CURRENT_TEST")
    return None if current is None else current.rsplit(" ", 1)[0]


def load() -> dict[str, dict[str, Any]]:
    try:
        return json.loads(RESULTS.read_text())
    except (OSError, ValueError):
        return {}
