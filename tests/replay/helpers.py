"""Replay test helpers: slices of the real shared traces."""

from __future__ import annotations

from pathlib import Path

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"
CONVERSATION = TRACES / "mooncake_conversation_t0-2700s.jsonl"
SYNTHETIC = TRACES / "mooncake_synthetic_trace.jsonl"
AZURE_CODE = TRACES / "AzureLLMInferenceTrace_code.csv"


def head_lines(path: Path, count: int) -> list[str]:
    with open(path, encoding="utf-8") as handle:
        return [next(handle) for _ in range(count)]
