"""Fault drills, bad input, security and soak: runs tests/drills and prints one row per drill.

    .venv/bin/python -m bench.drills.run               # every drill (what `make test` runs too)
    .venv/bin/python -m bench.drills.run --soak 600    # only the soak, 600 s, then the table
    .venv/bin/python -m bench.drills.run --table       # print the last recorded table only

Each drill records its row (scenario, sent, succeeded, failed with a clear error, lost,
audit events lost and canary judgements skipped where the drill measures them ("-"
elsewhere), recovery time and what "recovery" measured) into test-artifacts/drills.json; this script
runs pytest on tests/drills and prints the rows written by that run. It uses its own test
database (SWITCHYARD_TEST_DB, default test_switchyard_drills) so it can run beside other
test runs, and never stops the machine's shared Postgres or Redis: outage drills start
private ones.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "test-artifacts" / "drills.json"
COLUMNS = (
    "scenario",
    "sent",
    "succeeded",
    "failed_clear",
    "lost",
    "audit_events_lost",
    "judgements_skipped",
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
    "recovery (s)",
)


def run_pytest(soak_s: float | None, extra: list[str]) -> int:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.setdefault("SWITCHYARD_TEST_DB", "test_switchyard_drills")
    args = [
        sys.executable,
        "-m",
        "pytest",
        "tests/drills",
        "-q",
        "-p",
        "no:cacheprovider",
        "--show-capture=no",
        *extra,
    ]
    if soak_s is not None:
        env["SWITCHYARD_SOAK_S"] = f"{soak_s:g}"
        args += ["-k", "soak", "--timeout", str(int(soak_s) + 600)]
    return subprocess.run(args, cwd=REPO, env=env).returncode


def rows_since(started: str | None) -> list[dict[str, Any]]:
    try:
        rows = json.loads(RESULTS.read_text()).values()
    except (OSError, ValueError):
        return []
    return [r for r in rows if started is None or r["at"] >= started]


def cell(value: Any) -> str:
    return "-" if value is None else str(value)


def table(rows: list[dict[str, Any]]) -> str:
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


def machine() -> str:
    return (
        f"{platform.node()} · {os.cpu_count()} CPUs · {platform.platform()} · "
        f"Python {platform.python_version()}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--soak", type=float, metavar="SECONDS", help="run only the soak, for this long"
    )
    parser.add_argument("--table", action="store_true", help="print the last table only")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args()
    started = None
    status = 0
    if not args.table:
        started = time.strftime("%Y-%m-%d %H:%M:%S")
        status = run_pytest(args.soak, args.pytest_args)
    print(f"\nSwitchyard drills — {machine()}")
    print(
        "enginesim fleet: 4 instances, time-scale 0.05; loopback processes. For bad-input "
        "and authorization rows, 'failed (clear error)' counts requests correctly refused "
        "(4xx/401/403/redirect to login).\n"
    )
    print(table(rows_since(started)))
    return status


if __name__ == "__main__":
    sys.exit(main())
