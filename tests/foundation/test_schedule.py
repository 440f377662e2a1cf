"""The parallel run's schedule (tests/conftest.py): the longest files go first, and the
table naming them names files that exist."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import LONG_FILES, longest_files_first

ROOT = Path(__file__).resolve().parents[2]


def test_long_files_go_first_longest_first_and_each_file_keeps_its_order() -> None:
    longest, second = sorted(LONG_FILES, key=lambda path: -LONG_FILES[path])[:2]
    nodeids = [
        "tests/a.py::one",
        f"{second}::x",
        "tests/a.py::two",
        f"{longest}::y",
        "tests/b.py::three",
        f"{second}::z",
    ]
    order = [nodeids[i] for i in longest_files_first(nodeids)]
    assert order == [
        f"{longest}::y",
        f"{second}::x",
        f"{second}::z",
        "tests/a.py::one",
        "tests/a.py::two",
        "tests/b.py::three",
    ]


def test_every_long_file_exists() -> None:
    missing = [path for path in LONG_FILES if not (ROOT / path).is_file()]
    assert missing == [], f"LONG_FILES names files that are gone: {missing}"
