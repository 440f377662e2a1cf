"""Fault drills, bad input, security and soak: runs tests/drills and prints one row per drill.

    .venv/bin/python -m bench.drills.run               # every drill (what `make test` runs too)
    .venv/bin/python -m bench.drills.run --soak 600    # only the soak, 600 s, then the table
    .venv/bin/python -m bench.drills.run --table       # print the last recorded table only
    .venv/bin/python -m bench.drills.run --readme      # the README's table from docs/drills.json

Each drill records its row (scenario, sent, succeeded, failed with a clear error, lost,
audit events lost and canary judgements skipped where the drill measures them ("-"
elsewhere), recovery time and what "recovery" measured) into test-artifacts/drills.json; this script
runs pytest on tests/drills and prints the rows written by that run. It uses its own test
database (SWITCHYARD_TEST_DB, default test_switchyard_drills) so it can run beside other
test runs, and never stops the machine's shared Postgres or Redis: outage drills start
private ones. A run in which every drill passed also brings the README's drills table up
to date (bench/drills/table.py).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.drills import table as drills_table

REPO = Path(__file__).resolve().parents[2]


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
    rows = drills_table.ordered(drills_table.load(drills_table.RESULTS))
    return [r for r in rows if started is None or r["at"] >= started]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--soak", type=float, metavar="SECONDS", help="run only the soak, for this long"
    )
    parser.add_argument("--table", action="store_true", help="print the last table only")
    parser.add_argument(
        "--readme",
        action="store_true",
        help="render the README's drills table from docs/drills.json again, and stop",
    )
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args()
    if args.readme:
        rows = drills_table.load(drills_table.PUBLISHED)
        drills_table.README.write_text(
            drills_table.render_readme(drills_table.README.read_text(), rows)
        )
        print(f"README: the drills table rendered from {len(rows)} rows of docs/drills.json")
        return 0
    started = None
    status = 0
    if not args.table:
        started = time.strftime("%Y-%m-%d %H:%M:%S")
        status = run_pytest(args.soak, args.pytest_args)
    print(f"\nSwitchyard drills — {drills_table.machine()}")
    print(
        "enginesim fleet: 4 instances, time-scale 0.05; loopback processes. For bad-input "
        "and authorization rows, 'failed (clear error)' counts requests correctly refused "
        "(4xx/401/403/redirect to login).\n"
    )
    print(drills_table.table(rows_since(started)))
    return status


if __name__ == "__main__":
    sys.exit(main())
