"""The README's drills table is the drills' own output: rendered from the rows the drills
last published (docs/drills.json, bench/drills/table.py), never edited by hand, and
brought up to date by every drills run that passes."""

from __future__ import annotations

import re
from pathlib import Path

from bench.drills import table

DRILLS = table.REPO / "tests" / "drills"


def test_the_readme_table_is_rendered_from_the_published_rows():
    rows = table.load(table.PUBLISHED)
    assert rows, "docs/drills.json holds no rows: run the drills (make test)"
    readme = table.README.read_text()
    assert table.readme_rows(readme) == table.readme_block(rows), (
        "the README's drills table differs from docs/drills.json: it is rewritten by every "
        "drills run that passes (or `python -m bench.drills.run --readme`), not by hand"
    )


def test_every_published_row_comes_from_a_drill_that_exists():
    for scenario, row in table.load(table.PUBLISHED).items():
        assert row["scenario"] == scenario
        assert row.get("test") and table.defined(row["test"]), (scenario, row.get("test"))
        assert row["test"].startswith("tests/") and row.get("machine"), scenario


def test_every_drill_file_that_records_rows_has_rows_in_the_table():
    recording = {
        str(path.relative_to(table.REPO))
        for path in [*DRILLS.glob("test_*.py"), *table.REPO.glob("tests/web/test_*.py")]
        if re.search(r"^\s+record\(", path.read_text(), re.MULTILINE)
    }
    published = {row["test"].split("::")[0] for row in table.load(table.PUBLISHED).values()}
    assert recording <= published, sorted(recording - published)


def _row(scenario: str, test: str, at: str) -> dict:
    return {"scenario": scenario, "test": test, "at": at, "sent": 1, "machine": "m"}


def test_a_run_replaces_the_rows_of_the_drills_it_ran_and_keeps_the_others(tmp_path: Path):
    drills = tmp_path / "tests" / "drills"
    drills.mkdir(parents=True)
    (drills / "test_a.py").write_text("def test_one():\n    pass\n\n\ndef test_two(x):\n    pass\n")
    one, two = "tests/drills/test_a.py::test_one", "tests/drills/test_a.py::test_two[p]"
    gone = "tests/drills/test_a.py::test_removed"
    published = {
        "old name": _row("old name", one, "2020-01-01 00:00:00"),  # renamed since
        "kept": _row("kept", two, "2020-01-01 00:00:00"),  # not run this time
        "orphan": _row("orphan", gone, "2020-01-01 00:00:00"),  # its test is gone
        "legacy": {"scenario": "legacy", "sent": 1},  # no test recorded
    }
    recorded = {
        **published,
        "new name": _row("new name", one, "2030-01-01 00:00:01"),
        "stale": _row("stale", two, "2029-12-31 23:59:59"),  # before this run
    }
    rows = table.merged(published, recorded, {one}, "2030-01-01 00:00:00", repo=tmp_path)
    assert set(rows) == {"kept", "new name"}
    assert rows["new name"]["at"] == "2030-01-01 00:00:01"


def test_the_block_lists_rows_by_drill_with_the_machines_and_times():
    rows = {
        "b": _row("b", "tests/drills/test_b.py::test_x", "2030-01-02 00:00:00"),
        "a": _row("a", "tests/drills/test_c.py::test_y", "2030-01-01 00:00:00"),
    }
    rows["a"]["notes"] = "what recovery measured"
    block = table.readme_block(rows)
    assert block.startswith(table.BEGIN) and block.endswith(table.END)
    assert "recorded 2030-01-01 00:00:00 to 2030-01-02 00:00:00; m" in block
    lines = [line for line in block.splitlines() if line.startswith("| ")]
    assert [line.split("|")[1].strip() for line in lines] == ["scenario", "b", "a"]
    assert "- a: what recovery measured" in block
    rendered = table.render_readme(f"intro\n{table.BEGIN}\nold\n{table.END}\nafter\n", rows)
    assert rendered == f"intro\n{block}\nafter\n"
