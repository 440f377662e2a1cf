"""Cost coefficients of the policies that take them, from enginesim's cost model.

``predicted_ttft`` predicts TTFT from a handful of coefficients, and the decode guard of
``lmetric`` and ``smetric`` weighs decode steps with two; they reach the policies as
validated parameters, so the router never imports ``enginesim``. Whoever knows the
cluster's GPU and model fills them: the control plane when a policy is created or a
replay requested (``controlplane.services.policy_defaults``), the replay simulator for its
own cluster. Every coefficient left unset (``None``) is derived; values that were set are
kept. predicted_ttft cannot run without its coefficients, so unknown hardware is an
error for it; the decode guard then keeps the reference fleet's values (its
``REFERENCE_DECODE_COSTS``), as only their ratio to a context token's KV read matters.
"""

from __future__ import annotations

import contextlib
from functools import lru_cache
from typing import Any

from enginesim.engine import GPUS, MODELS, EngineConfig
from enginesim.engine.costmodel import CostModel, StepBatch
from enginesim.engine.transfer import get_link
from router_worker.routing.policies.decode_guard import DECODE_COST_FIELDS
from router_worker.routing.policies.predicted_ttft import COEFFICIENT_FIELDS

# Policy kinds whose parameters include cost coefficients, and which ones.
COST_MODEL_FIELDS: dict[str, tuple[str, ...]] = {
    "predicted_ttft": COEFFICIENT_FIELDS,
    "lmetric": DECODE_COST_FIELDS,
    "smetric": DECODE_COST_FIELDS,
    "llmd_precise": ("prefill_tps",),
}
# Kinds that run without their coefficients (reference values) when the hardware is unknown.
OPTIONAL_DERIVATION = frozenset({"lmetric", "smetric", "llmd_precise"})
SIGNIFICANT_DIGITS = 4  # enough for routing, readable in forms and audit rows


class UnknownHardwareError(ValueError):
    """enginesim has no cost model for this GPU or model (or the model does not fit)."""


def unset_fields(kind: str, params: dict[str, Any]) -> list[str]:
    """The cost coefficients of ``kind`` that ``params`` leaves unset."""
    return [name for name in COST_MODEL_FIELDS.get(kind, ()) if params.get(name) is None]


def fill_coefficients(
    kind: str, params: dict[str, Any], gpu_type: str, model: str
) -> dict[str, Any]:
    """``params`` with every unset cost coefficient of ``kind`` derived for the hardware;
    ``params`` itself for kinds without coefficients or with all of them set.
    Raises UnknownHardwareError when enginesim does not know the hardware."""
    missing = unset_fields(kind, params)
    if not missing:
        return params
    try:
        derived = {**derive_coefficients(gpu_type, model), **derive_decode_costs(gpu_type, model)}
    except UnknownHardwareError:
        if kind in OPTIONAL_DERIVATION:
            return params
        raise
    return {**params, **{name: derived[name] for name in missing}}


def derive_decode_costs(gpu_type: str, model: str) -> dict[str, float]:
    """The decode guard's costs for ``model`` on ``gpu_type``: a one-token step (the weight
    read and the fixed overheads) and what one more running request adds to a step, each
    over what one more context token of a decoding request adds (its KV read)."""
    coefficients = dict(_derive(*_engine_keys(gpu_type, model)))
    per_token = float(coefficients["context_token_s"])
    values = {
        "decode_fixed_tokens": float(coefficients["min_step_s"]) / per_token,
        "decode_seq_tokens": float(coefficients["decode_seq_s"]) / per_token,
    }
    return {name: float(f"{value:.{SIGNIFICANT_DIGITS}g}") for name, value in values.items()}


def derive_coefficients(gpu_type: str, model: str) -> dict[str, float | int]:
    """``predicted_ttft``'s coefficients for one instance of ``model`` on ``gpu_type``.

    From enginesim's cost model with vLLM's defaults for the GPU (EngineConfig), priced at a
    full prefill step of ``chunk`` = max_num_batched_tokens tokens (the steps a queued
    prefill runs in): prefill_tps = chunk / that step's compute time; attention_pair_s =
    the attention compute of one (query, key) pair; decode_seq_s = t_per_seq + the compute
    one more sampled token adds to the step; step_overhead_s = t_fixed + t_per_seq;
    min_step_s = the time of a one-token step (the weight read: the memory floor);
    context_token_s = what one more cached token of a decoding request adds to a decode
    step (its KV read: decode is memory-bound, so this is not attention_pair_s).
    """
    return dict(_derive(*_engine_keys(gpu_type, model)))


def _engine_keys(gpu_type: str, model: str) -> tuple[str, str]:
    return gpu_key(gpu_type), model_key(model)


def gpu_key(gpu_type: str) -> str:
    """enginesim's key for a GPU name (``H100`` -> ``h100``); UnknownHardwareError naming
    the known ones otherwise. The control plane checks a cluster's GPU with it, and replays
    and the policy defaults look the GPU up with it."""
    gpu = gpu_type.strip().lower()
    if gpu not in GPUS:
        raise UnknownHardwareError(
            f"enginesim knows no GPU {gpu_type!r} (known: {', '.join(sorted(GPUS))})"
        )
    return gpu


def model_key(model: str) -> str:
    """enginesim's key for a served model: its key, its served name, or that name without
    the organisation or the ``-Instruct`` suffix (``Qwen/Qwen2-7B`` -> ``qwen2-7b``);
    UnknownHardwareError naming the known ones otherwise."""
    wanted = _model_names(model)
    for key, spec in MODELS.items():
        if wanted & (_model_names(key) | _model_names(spec.served_name)):
            return key
    raise UnknownHardwareError(
        f"enginesim knows no model {model!r} (known: {', '.join(sorted(MODELS))})"
    )


def _model_names(name: str) -> set[str]:
    """Spellings of one model: as given, without the organisation, without -Instruct."""
    full = name.strip().lower()
    short = full.rsplit("/", 1)[-1]
    return {full, short, short.removesuffix("-instruct")} - {""}


@lru_cache(maxsize=64)
def _derive(gpu: str, model: str) -> tuple[tuple[str, float | int], ...]:
    try:
        config = EngineConfig.for_hardware(gpu, model)
    except ValueError as error:  # the model does not fit on the GPU
        raise UnknownHardwareError(str(error)) from None
    cost = config.cost_model()
    calibration = cost.calibration
    chunk = config.max_num_batched_tokens
    pairs = chunk * chunk / 2.0
    # a batch of scalars is priced as floats
    full = float(cost.cost(StepBatch(chunk, 1, 0, 0, 0)).compute_time)
    with_attention = float(cost.cost(StepBatch(chunk, 1, 0, pairs, 0)).compute_time)
    # one more running request in that step: its token, sampled
    with_decode = float(cost.cost(StepBatch(chunk + 1, 2, 1, 0, 0)).compute_time)
    values: dict[str, float | int] = {
        "prefill_tps": chunk / full,
        "step_overhead_s": calibration.t_fixed + calibration.t_per_seq,
        "decode_seq_s": calibration.t_per_seq + (with_decode - full),
        "attention_pair_s": (with_attention - full) / pairs,
        "min_step_s": cost.step_time(StepBatch.prefill(1)),
        "context_token_s": _context_token_time(cost),
    }
    rounded = {name: float(f"{value:.{SIGNIFICANT_DIGITS}g}") for name, value in values.items()}
    rounded["chunk_tokens"] = int(chunk)
    return tuple((name, rounded[name]) for name in COEFFICIENT_FIELDS)


_LONG_CONTEXT = 100_000  # tokens: far enough into the memory-bound regime of a decode step


def _context_token_time(cost: CostModel) -> float:
    short = cost.step_time(StepBatch.decode(1, 1_000))
    long = cost.step_time(StepBatch.decode(1, 1_000 + _LONG_CONTEXT))
    return (long - short) / _LONG_CONTEXT


def derive_decider(kind: str, threshold_tokens: int, model: str, link: str) -> dict[str, Any]:
    """The disaggregation decider's parameters (``router_worker.routing.disagg``'s
    ``DeciderParams``) for a fleet serving ``model`` whose prefill and decode instances are
    joined by ``link`` (a key of enginesim's ``LINKS``): the model's KV bytes per token from
    its layout, the link's bandwidth and latency. A model enginesim does not know keeps the
    router's reference bytes per token (the cost decider's estimate is then approximate)."""
    spec = get_link(link)
    params: dict[str, Any] = {
        "kind": kind,
        "threshold_tokens": threshold_tokens,
        "link_bandwidth": spec.bandwidth,
        "link_latency": spec.latency,
    }
    with contextlib.suppress(UnknownHardwareError):
        params["kv_bytes_per_token"] = MODELS[model_key(model)].kv_bytes_per_token()
    return params
