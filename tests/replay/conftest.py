"""Replay fixtures: heads of the real shared traces (tests/replay/helpers.py) in temp files."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.replay.helpers import head_lines


@pytest.fixture
def trace_head(tmp_path: Path):
    """Write the first ``count`` lines of a real trace to a temp file; returns its path."""

    def make(source: Path, count: int, suffix: str = ".jsonl") -> Path:
        path = tmp_path / f"{source.stem}_head{suffix}"
        path.write_text("".join(head_lines(source, count)))
        return path

    return make
