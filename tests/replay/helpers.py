"""Replay test helpers: slices of the real shared traces, and a synthetic hot-prefix trace."""

from __future__ import annotations

from pathlib import Path

from enginesim.replay.traces import TraceRecord

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"
CONVERSATION = TRACES / "mooncake_conversation_t0-2700s.jsonl"
SYNTHETIC = TRACES / "mooncake_synthetic_trace.jsonl"
AZURE_CODE = TRACES / "AzureLLMInferenceTrace_code.csv"


def head_lines(path: Path, count: int) -> list[str]:
    with open(path, encoding="utf-8") as handle:
        return [next(handle) for _ in range(count)]


def hotspot(count: int = 60, rate: float = 4.0) -> list[TraceRecord]:
    """Prompts of 6000 tokens that share their first 4096 (8 blocks of 512): a hot prefix."""
    return [
        TraceRecord(k, k / rate, 6000, 20, (*range(8), *(1000 + 10 * k + b for b in range(4))), 512)
        for k in range(count)
    ]
