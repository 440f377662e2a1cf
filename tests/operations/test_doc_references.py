"""Code and docs point to the repository's own documents, never outside it.

The architecture is written down in ``docs/architecture.md`` and the routing rules in
``docs/algorithms.md``. A docstring or comment that cites a design document the repository
does not hold, a numbered research summary, or an issue number sends the reader somewhere
they cannot follow (and such references go stale silently), so no source file, template or
Markdown document of the repository may carry one. The check reads the files, so a
reference on a path no test exercises is caught too."""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SKIPPED_DIRS = {".venv", "node_modules", ".git", "var", "test-artifacts", "__pycache__"}
CHECKED_SUFFIXES = {".py", ".md", ".html"}

# Built so that this file does not match itself.
OUTSIDE_REFERENCE = re.compile(
    "|".join(
        (
            r"\bDESIGN" + r"\.md\b",  # the founding design document, kept outside the repository
            r"\bissues?\s*#?\s*\d+",  # an issue number, with or without "#"
            r"\bseeds?\s+0\d\d\b",  # the numbered research summaries
        )
    ),
    re.IGNORECASE,
)


def checked_files(root: Path = ROOT) -> list[Path]:
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [name for name in dirs if name not in SKIPPED_DIRS]
        found += [Path(folder, name) for name in files if Path(name).suffix in CHECKED_SUFFIXES]
    return found


def outside_references(text: str, filename: str = "<text>") -> list[str]:
    """``file:line: text`` of every line that points outside the repository."""
    return [
        f"{filename}:{number}: {line.strip()[:100]}"
        for number, line in enumerate(text.splitlines(), start=1)
        if OUTSIDE_REFERENCE.search(line)
    ]


def test_the_pattern_catches_each_kind_of_reference():
    design, issue, seed = "DESIGN" + ".md", "iss" + "ue", "se" + "ed"
    assert outside_references(f'"""Telemetry out ({design} §2)."""')
    assert outside_references(f"# Resource limits ({issue} 21): each hit ...")
    assert outside_references(f"({issue.title()} #19)")
    assert outside_references(f"{issue}s 6, 22")
    assert outside_references(f"Preble's E2 rule ({seed} 003 §1.2)")
    assert not outside_references("simulator seeds 1-3; seed 1; see docs/architecture.md")
    assert not outside_references("tissue 3, reissue 4")


def test_no_file_points_outside_the_repository():
    problems = []
    for path in checked_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        problems += outside_references(text, str(path.relative_to(ROOT)))
    assert not problems, (
        "point to docs/architecture.md or docs/algorithms.md instead:\n" + "\n".join(problems)
    )
