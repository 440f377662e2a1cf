"""The router overhead bench's cold-path rows size their eviction from sysfs's cache list."""

from __future__ import annotations

from pathlib import Path

from bench.lib.router_cold_path import FALLBACK_CACHE_BYTES, last_level_cache_bytes


def _cache(root: Path, index: int, level: str, size: str) -> None:
    entry = root / f"index{index}"
    entry.mkdir(parents=True)
    (entry / "level").write_text(level + "\n")
    (entry / "size").write_text(size + "\n")


def test_the_highest_level_listed_wins_whatever_its_order(tmp_path: Path) -> None:
    _cache(tmp_path, 0, "1", "32K")
    _cache(tmp_path, 3, "3", "32768K")
    _cache(tmp_path, 2, "2", "1024K")
    assert last_level_cache_bytes(tmp_path) == 32 << 20


def test_sizes_in_megabytes_or_plain_bytes_are_read(tmp_path: Path) -> None:
    _cache(tmp_path, 0, "2", "2M")
    assert last_level_cache_bytes(tmp_path) == 2 << 20
    _cache(tmp_path, 1, "3", "4096")
    assert last_level_cache_bytes(tmp_path) == 4096


def test_no_readable_entry_falls_back(tmp_path: Path) -> None:
    assert last_level_cache_bytes(tmp_path / "missing") == FALLBACK_CACHE_BYTES
    _cache(tmp_path, 0, "three", "8M")
    _cache(tmp_path, 1, "3", "lots")
    assert last_level_cache_bytes(tmp_path) == FALLBACK_CACHE_BYTES
