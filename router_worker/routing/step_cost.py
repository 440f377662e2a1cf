"""The engine step's cost model, shared by the policies that predict decode and prefill
(``predicted_ttft``) and grey-failure detection's expected TPOT.

A vLLM decode step costs a fixed part (launch, scheduling, sampling), a part per running
request (its token, its sampling, its slot) and a part per context token of the batch
(reading its KV from memory), never less than reading the weights once. The coefficients
are enginesim's calibrated roofline model reduced to four numbers; the reference ones are
an H20 serving Qwen2-7B (``controlplane.services.policy_defaults`` derives them for a
cluster's GPU and model).

A prefill costs its tokens' GEMMs (at ``prefill_tps``, compute bound) and its attention,
per (query, key) pair (``attention_pair_s``; :func:`router_worker.routing.indicators.
attention_pairs` counts a prompt's). With chunked prefill the engine runs those chunks in
the same steps as its decodes, so what a request decoding on an instance waits for is the
decode steps plus the prefill work the instance completed meanwhile (:func:`prefill_s`).
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np

# enginesim's cost model for an H20 serving Qwen2-7B (calibration era v1).
REFERENCE_DECODE_STEP: dict[str, float] = {
    "step_overhead_s": 0.002258,
    "decode_seq_s": 0.0001619,
    "min_step_s": 0.005957,
    "context_token_s": 1.5e-08,
}

# The same model's prefill (calibration era v1, a full step of 8,192 tokens): tokens per
# second of GEMM work, and the attention of one (query, key) pair.
REFERENCE_PREFILL: dict[str, float] = {
    "prefill_tps": 7239.0,
    "attention_pair_s": 4.249e-9,
}

Value = TypeVar("Value", float, np.ndarray)


def decode_step_s(
    batch: Value,
    context_tokens: Value,
    *,
    step_overhead_s: float,
    decode_seq_s: float,
    min_step_s: float,
    context_token_s: float,
) -> Value:
    """Seconds of one decode step of ``batch`` running requests holding ``context_tokens``
    in all (scalars or arrays, broadcast)."""
    fixed = np.maximum(min_step_s, step_overhead_s + batch * decode_seq_s)
    return fixed + context_tokens * context_token_s


def prefill_s(
    tokens: Value, pairs: Value, *, prefill_token_s: float, attention_pair_s: float
) -> Value:
    """Seconds of prefill work for ``tokens`` prompt tokens whose attention computes
    ``pairs`` (query, key) pairs (scalars or arrays, broadcast)."""
    return tokens * prefill_token_s + pairs * attention_pair_s
