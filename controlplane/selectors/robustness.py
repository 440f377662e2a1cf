"""Where each policy kind breaks the never-collapse invariant, from the robustness suite.

``bench/robustness/run.py`` replays the regimes the evaluation matrix leaves out (long
outputs under KV pressure, slow or mis-modelled engines, mixed GPUs, delayed telemetry,
several routers, other fleets) and, after a whole run, writes a per-kind summary to
``controlplane/data/robustness.json``::

    {"source": ..., "generated": "2026-12-04", "seeds": 3, "invariant": "...",
     "policies": {"lmetric": {"cells": 36, "breaks": [
         {"cell": "long_output@l40s+qwen2.5-7b/high",
          "breaches": ["throughput 0.94× round robin's"]}]}}}

An operator choosing a policy (the policy form, the replay form, the API's policy kinds)
sees per kind either "keeps the invariant in all N cells" or the cells where it breaks.
The file is optional: without it, or when it cannot be read, every kind reads as
"unavailable" — a bad file is logged, never a failed page. The path is the setting
``SWITCHYARD_ROBUSTNESS_SUMMARY`` when set (tests point it at a fixture).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date
from functools import lru_cache
from pathlib import Path
from typing import Literal

from django.conf import settings
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from enginesim.replay.invariant import REFERENCES
from router_worker.routing import REGISTRY

logger = logging.getLogger(__name__)

NO_RUN = "no robustness run recorded"
UNREADABLE = "robustness summary unreadable (see the control plane's log)"
Status = Literal["keeps", "breaks", "not_judged", "unavailable"]


def summary_path() -> Path:
    configured = getattr(settings, "SWITCHYARD_ROBUSTNESS_SUMMARY", None)
    default = Path(settings.BASE_DIR) / "controlplane" / "data" / "robustness.json"
    return Path(configured) if configured else default


@dataclass(frozen=True)
class CellBreak:
    cell: str  # regime@fleet/load, as the suite names it
    breaches: tuple[str, ...]  # "throughput 0.94× round robin's", ...


@dataclass(frozen=True)
class KindRobustness:
    """One policy kind's record in the suite, with the sentence an operator reads."""

    kind: str
    status: Status
    headline: str
    cells: int | None = None
    breaks: tuple[CellBreak, ...] = ()
    generated: date | None = None
    invariant: str = ""  # what the suite checks, as the file states it


@dataclass(frozen=True)
class Robustness:
    """The whole summary (``available`` False: no file, or one that could not be read)."""

    available: bool
    note: str = ""
    generated: date | None = None
    seeds: int | None = None
    invariant: str = ""
    source: str = ""
    policies: Mapping[str, KindRobustness] = field(default_factory=dict)

    def of(self, kind: str) -> KindRobustness:
        if not self.available:
            return KindRobustness(kind, "unavailable", self.note)
        found = self.policies.get(kind)
        if found is not None:
            return found
        why = (
            "The invariant's reference: not itself judged by the robustness suite"
            if kind in REFERENCES
            else "Not in the robustness suite's last run"
        )
        return KindRobustness(
            kind, "not_judged", f"{why} ({self.generated})", invariant=self.invariant
        )


def robustness() -> Robustness:
    """The recorded summary, re-read only when the file changes."""
    path = summary_path()
    try:
        stat = path.stat()
    except FileNotFoundError:
        return Robustness(available=False, note=NO_RUN)
    except OSError as error:
        logger.error("robustness summary %s cannot be read: %s", path, error)
        return Robustness(available=False, note=UNREADABLE)
    return _load(str(path), stat.st_mtime_ns, stat.st_size)


def by_kind(kinds: Iterable[str] | None = None) -> dict[str, KindRobustness]:
    """Each of ``kinds`` (default: every registered policy kind) → its record."""
    summary = robustness()
    return {kind: summary.of(kind) for kind in (REGISTRY if kinds is None else kinds)}


# -- the file's format ---------------------------------------------------------------


class _Break(BaseModel):
    model_config = ConfigDict(frozen=True)
    cell: str = Field(min_length=1)
    breaches: list[str] = Field(min_length=1)


class _KindRecord(BaseModel):
    model_config = ConfigDict(frozen=True)
    cells: int = Field(ge=1)
    breaks: list[_Break]

    @model_validator(mode="after")
    def _breaks_within_cells(self) -> _KindRecord:
        if len(self.breaks) > self.cells:
            raise ValueError(f"{len(self.breaks)} breaks in {self.cells} cells")
        return self


class _Summary(BaseModel):
    """The file as bench/robustness/run.py's ``control_plane_summary`` writes it (keys it
    may add later are ignored)."""

    source: str
    generated: date
    seeds: int = Field(ge=1)
    invariant: str
    policies: dict[str, _KindRecord]


@lru_cache(maxsize=4)
def _load(path: str, mtime_ns: int, size: int) -> Robustness:
    """Parse one version of the file (the cache key names it, so a malformed file is
    logged once per version, not once per page)."""
    try:
        summary = _Summary.model_validate(json.loads(Path(path).read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, ValidationError) as error:
        reason = " ".join(str(error).split())
        logger.error("robustness summary %s is malformed, showing none: %s", path, reason)
        return Robustness(available=False, note=UNREADABLE)
    return Robustness(
        available=True,
        generated=summary.generated,
        seeds=summary.seeds,
        invariant=summary.invariant,
        source=summary.source,
        policies={kind: _kind(kind, record, summary) for kind, record in summary.policies.items()},
    )


def _kind(kind: str, record: _KindRecord, summary: _Summary) -> KindRobustness:
    breaks = tuple(CellBreak(b.cell, tuple(b.breaches)) for b in record.breaks)
    where = f"cells of the robustness suite ({summary.generated})"
    if breaks:
        headline = f"Breaks the invariant in {len(breaks)} of {record.cells} {where}"
    else:
        headline = f"Keeps the invariant in all {record.cells} {where}"
    return KindRobustness(
        kind,
        "breaks" if breaks else "keeps",
        headline,
        record.cells,
        breaks,
        summary.generated,
        summary.invariant,
    )
