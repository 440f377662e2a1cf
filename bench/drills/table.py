"""The drills table: rendered from the drills' rows, printed by ``run.py`` and kept in the
README, where it is rewritten at the end of every drills run that passes.

Each drill records its rows in ``test-artifacts/drills.json`` (tests/drills/report.py),
with the test that recorded it and the machine it ran on. At the end of a pytest session
in which drills recorded rows and none of the tests that record rows failed
(tests/conftest.py calls :func:`publish`), the
published rows (``docs/drills.json``, committed) are brought up to date: the rows this
session recorded replace those of the tests that ran, rows of tests that ran and no longer
record them (a renamed scenario) or of tests that no longer exist are dropped, and the
others (drills this session did not run) are kept. The README's table between the two
markers is then rendered from those rows, so it always shows what the drills last
measured; ``tests/operations/test_drills_table.py`` fails when the README and
``docs/drills.json`` disagree (a hand edit). ``python -m bench.drills.run --readme``
renders the README's table from ``docs/drills.json`` again (after a merge, say).
"""

from __future__ import annotations

import json
import os
import platform
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "test-artifacts" / "drills.json"  # every row recorded here, newest wins
PUBLISHED = REPO / "docs" / "drills.json"  # the rows the README shows
README = REPO / "README.md"
BEGIN = (
    "<!-- drills table: rewritten by every drills run that passes (bench/drills/table.py, "
    "from docs/drills.json); do not edit -->"
)
END = "<!-- end of the drills table -->"
COLUMNS = (
    "scenario",
    "sent",
    "succeeded",
    "failed_clear",
    "lost",
    "audit_events_lost",
    "judgements_skipped",
    "fivexx_seen",
    "loops_stalled",
    "recovery_s",
)
HEADERS = (
    "scenario",
    "sent",
    "succeeded",
    "failed (clear error)",
    "requests lost",
    "audit events lost",
    "judgements skipped",
    "5xx seen",
    "loops stalled",
    "recovery (s)",
)


def machine() -> str:
    return (
        f"{platform.node()} · {os.cpu_count()} CPUs · {platform.platform()} · "
        f"Python {platform.python_version()}"
    )


def cell(value: Any) -> str:
    return "-" if value is None else str(value)


def table(rows: Iterable[dict[str, Any]]) -> str:
    rows = list(rows)
    cells = [HEADERS, *[[cell(r.get(c)) for c in COLUMNS] for r in rows]]
    widths = [max(len(line[i]) for line in cells) for i in range(len(HEADERS))]
    lines = []
    for n, line in enumerate(cells):
        lines.append(
            "| " + " | ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)) + " |"
        )
        if n == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    notes = [f"- {r['scenario']}: {r['notes']}" for r in rows if r.get("notes")]
    return "\n".join([*lines, "", "Notes:", *notes])


def ordered(rows: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """By the test that records them (so a drill's rows stay together), then scenario."""
    return sorted(rows.values(), key=lambda r: (r.get("test") or "", r["scenario"]))


def load(path: Path) -> dict[str, dict[str, Any]]:
    try:
        rows = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return rows if isinstance(rows, dict) else {}


def readme_block(rows: dict[str, dict[str, Any]]) -> str:
    listed = ordered(rows)
    machines = sorted({r.get("machine") or "machine not recorded" for r in listed})
    runs = sorted(r["at"] for r in listed if r.get("at"))
    when = f"recorded {runs[0]} to {runs[-1]}" if runs else "no run recorded"
    return "\n".join(
        [
            BEGIN,
            "",
            f"Each drill's row from its last passing run ({when}; {'; '.join(machines)}):",
            "",
            table(listed),
            "",
            END,
        ]
    )


def render_readme(text: str, rows: dict[str, dict[str, Any]]) -> str:
    """``text`` with its drills table (between the markers) rendered from ``rows``."""
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.DOTALL)
    if not pattern.search(text):
        raise ValueError("the README has no drills table markers")
    return pattern.sub(lambda _: readme_block(rows), text, count=1)


def readme_rows(text: str) -> str:
    """The README's drills table block as it stands."""
    start, end = text.index(BEGIN), text.index(END)
    return text[start : end + len(END)]


def defined(nodeid: str, repo: Path = REPO) -> bool:
    """Whether the test ``nodeid`` (``path::name[params]``) is still defined."""
    path, _, name = nodeid.partition("::")
    function = name.split("[", 1)[0]
    try:
        source = (repo / path).read_text()
    except OSError:
        return False
    return re.search(rf"^(async )?def {re.escape(function)}\(", source, re.MULTILINE) is not None


def merged(
    published: dict[str, dict[str, Any]],
    recorded: dict[str, dict[str, Any]],
    ran: set[str],
    since: str,
    repo: Path = REPO,
) -> dict[str, dict[str, Any]]:
    """The published rows brought up to date with a session that ran the tests ``ran``
    and recorded the rows of ``recorded`` whose ``at`` is ``since`` or later."""
    rows = {
        scenario: row
        for scenario, row in published.items()
        if row.get("test") not in ran and row.get("test") and defined(row["test"], repo)
    }
    for scenario, row in recorded.items():
        if row.get("at", "") >= since and row.get("test") in ran:
            rows[scenario] = row
    return rows


def write_published(rows: dict[str, dict[str, Any]]) -> None:
    PUBLISHED.write_text(json.dumps({r["scenario"]: r for r in ordered(rows)}, indent=2) + "\n")
    README.write_text(render_readme(README.read_text(), rows))


def publish(ran: set[str], since: str) -> int:
    """After a session that ran the drills ``ran`` (all passed) from ``since``: the
    published rows and the README's table brought up to date. Returns the row count."""
    rows = merged(load(PUBLISHED), load(RESULTS), ran, since)
    write_published(rows)
    return len(rows)
