"""The tuning split and the evaluation split, divided once, here.

A default chosen on cells that are then scored proves nothing. Every default whose
provenance is ``matrix`` is chosen by ``bench/tuning/run.py`` on the tuning split and
reported on the evaluation split, which the choice never saw. The division:

* **recorded traces** (the matrix's Mooncake and Azure traces): each trace's arrival span
  cut at its middle; the tuning split draws its windows from the first half, the
  evaluation split from the second. A window is the workload's (for a whole-trace
  workload, half of the split's half; at most the half), at a seeded start inside the
  half, re-timed per seed as the matrix re-times (``bench.lib.matrix``);
* **generated workloads** (agentic sessions, the hotspot burst): generator seeds
  ``params.seed + 1000 + i`` for tuning, ``params.seed + i`` (the matrix's) for evaluation;
* **fleets**: tuning on the matrix's 16 × H20 + Qwen2-7B and 16 × A100 + Qwen3-8B;
  evaluation on 16 × H100 + Llama-3.1-8B, 16 × L40S + Qwen2.5-7B and 16 × H20 + Qwen3-32B.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from bench.lib.matrix import (
    RESAMPLE_SEED,
    RETIME_BIN_S,
    WORKLOAD_BY_NAME,
    Workload,
)
from enginesim.replay.traces import TraceRecord, read_trace, retime, select

Split = Literal["tuning", "evaluation"]
SPLITS: tuple[Split, ...] = ("tuning", "evaluation")
FLEETS: dict[Split, tuple[tuple[str, str], ...]] = {
    "tuning": (("h20", "qwen2-7b"), ("a100", "qwen3-8b")),
    "evaluation": (("h100", "llama-3.1-8b"), ("l40s", "qwen2.5-7b"), ("h20", "qwen3-32b")),
}
GENERATOR_OFFSET: dict[Split, int] = {"tuning": 1000, "evaluation": 0}


@dataclass(frozen=True)
class Half:
    """A split's share of one recorded trace's arrival span, in trace seconds."""

    start_s: float
    end_s: float


def trace_half(records: list[TraceRecord], split: Split) -> Half:
    first, last = records[0].arrival_s, records[-1].arrival_s
    middle = (first + last) / 2
    return Half(first, middle) if split == "tuning" else Half(middle, last)


def records(
    workload: str, split: Split, replicate: int, limit: int | None = None
) -> list[TraceRecord]:
    """``workload``'s requests at rate scale 1 for ``split``'s replicate ``replicate``."""
    spec = WORKLOAD_BY_NAME[workload]
    if spec.trace is None:
        return spec.build(limit, GENERATOR_OFFSET[split] + replicate)
    return _trace_records(spec, split, replicate, limit)


def window(
    trace: list[TraceRecord], spec: Workload, split: Split, replicate: int
) -> tuple[float, float]:
    """[start, end) in trace seconds of ``split``'s replicate ``replicate`` window."""
    half = trace_half(trace, split)
    room = half.end_s - half.start_s
    length = min(spec.window_s or room / 2, room)
    rng = np.random.default_rng(RESAMPLE_SEED + GENERATOR_OFFSET[split] + replicate)
    start = half.start_s + float(rng.uniform(0.0, room - length))
    return start, start + length


def _trace_records(
    spec: Workload, split: Split, replicate: int, limit: int | None
) -> list[TraceRecord]:
    assert spec.trace is not None
    trace = read_trace(spec.trace)
    start, end = window(trace, spec, split, replicate)
    chosen = select(trace, start_s=start, end_s=end, max_requests=limit)
    return retime(chosen, RESAMPLE_SEED + GENERATOR_OFFSET[split] + replicate, RETIME_BIN_S)
