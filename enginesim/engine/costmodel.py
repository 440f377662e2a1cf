"""Roofline step-time model of one vLLM engine step.

    t = (t_fixed + t_per_seq * num_seqs + max(FLOPs / (peak * eta_c), bytes / (BW * eta_m)))
        / speed + transfer_time

eta_c and eta_m are fitted per GPU architecture (fp8 GEMMs on Hopper have their own eta_c),
t_fixed per vLLM era; see ``Calibration``. Outside the steps every request pays
``t_request`` once (HTTP, tokenisation, first-token return): the engine core admits it
that long after its arrival.

FLOPs = 2 * active non-embedding params * scheduled tokens      (GEMMs)
      + 2 * hidden * vocab * sampled tokens                      (LM head, sampled rows only)
      + 4 * layers * q_heads * head_dim * attention pairs        (QK^T and PV)
bytes = weights (dense: all; MoE: attention/router + the experts the batch touches + LM head)
      + KV bytes/token * (context tokens read + scheduled tokens written)
Attention FLOPs run at the bf16 peak even for fp8 checkpoints; expert-weight reads are
additionally divided by eta_moe (vLLM's fused-MoE kernels fall short of the HBM roofline
at small batches).

``speed`` is an instance's factor against that model (enginesim.engine.fleet): 0.5 makes
every step's GPU part take twice as long; the tier transfer (a link, not the GPU) is not
scaled. It is 1 for every engine unless a fleet says otherwise.

MoE routing is assumed uniform: a step with T tokens touches E * (1 - (1 - k/E)^T)
experts per layer, so weight traffic grows with the batch until all experts are read.

The fields of ``StepBatch`` may be numpy arrays (one entry per step); the engine core
uses that to price a whole decode-only stretch in one vectorised call.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np

from enginesim.engine.hardware import GPUSpec, get_gpu
from enginesim.engine.models import DTYPE_BYTES, ModelSpec, get_model

CALIBRATION_FILE = Path(__file__).with_name("calibration.json")
# A step's quantity: a float for one step, an array (elementwise) for many
Amount: TypeAlias = float | np.ndarray


@dataclass(frozen=True)
class GPUEfficiency:
    """Achieved fractions of a GPU architecture's datasheet peaks under vLLM's kernels."""

    eta_compute: float  # of the dense tensor-core FLOP/s (GEMMs; attention at the bf16 peak)
    eta_memory: float  # of the HBM bandwidth (weight and KV reads: what decode is bound by)
    eta_compute_fp8: float | None = None  # of the fp8 peak, for fp8 GEMMs; None = eta_compute

    def compute_efficiency(self, dtype: str) -> float:
        """Dynamic fp8 (W8A8) GEMMs quantise activations on the fly and reach a smaller
        fraction of their (twice as high) peak than bf16 GEMMs do of theirs."""
        if dtype == "fp8" and self.eta_compute_fp8 is not None:
            return self.eta_compute_fp8
        return self.eta_compute


@dataclass(frozen=True)
class Calibration:
    """Fitted constants of one vLLM era; see calibration.json and
    ``python -m enginesim.engine.calibrate``.

    ``gpus`` holds the efficiencies per GPU architecture (``GPUSpec.arch``): the kernels
    and how close they get to the datasheet differ between Ampere, Ada and Hopper.
    ``t_request`` is latency every request pays once, outside any step: the API server's
    HTTP handling and tokenisation before the engine sees it, and detokenising and
    streaming its first token back. The engine core admits a request no earlier than
    ``t_request`` after its arrival, so a lone one-token prompt's TTFT is at least that.
    """

    gpus: Mapping[str, GPUEfficiency]
    t_fixed: float  # s per step (launch, scheduling, sampling, output processing)
    t_per_seq: float = 0.0  # s per scheduled sequence per step
    eta_moe: float = 1.0  # extra efficiency factor of expert-weight reads (fused-MoE kernels)
    t_request: float = 0.0  # s per request, outside the steps (HTTP, tokenisation)
    era: str = "v1"

    def efficiency(self, gpu: GPUSpec) -> GPUEfficiency:
        try:
            return self.gpus[gpu.arch]
        except KeyError:
            raise KeyError(
                f"calibration era {self.era!r} has no efficiencies for "
                f"architecture {gpu.arch!r} (GPU {gpu.key!r}); "
                f"known: {sorted(self.gpus)}"
            ) from None


def load_calibration(era: str = "v1", path: Path = CALIBRATION_FILE) -> Calibration:
    """Load the fitted constants of a vLLM era ("v1": V1 engine >= 0.8, "v0": older)."""
    data = json.loads(path.read_text())
    params = dict(data["eras"][era])
    gpus = {arch: _efficiency(eff) for arch, eff in params.pop("gpus").items()}
    return Calibration(gpus=gpus, era=era, **{k: float(v) for k, v in params.items()})


def _efficiency(raw: Mapping[str, Any]) -> GPUEfficiency:
    values: dict[str, Any] = {k: None if v is None else float(v) for k, v in raw.items()}
    return GPUEfficiency(**values)


@dataclass(frozen=True)
class StepBatch:
    """Aggregate work of one engine step (or, with array fields, of many steps)."""

    num_tokens: Amount  # tokens scheduled (prefill chunks + decode tokens)
    num_seqs: Amount  # requests in the step
    num_sampled: Amount  # requests that sample a token this step
    attention_pairs: Amount  # sum_i new_i * ctx_i + new_i * (new_i + 1) / 2
    context_tokens: Amount  # sum_i ctx_i: KV tokens already cached and read by attention
    transfer_time: Amount = 0.0  # s spent loading KV blocks from the global tier

    @classmethod
    def from_requests(
        cls,
        new_tokens: list[int],
        contexts: list[int],
        num_sampled: int,
        transfer_time: float = 0.0,
    ) -> StepBatch:
        pairs = sum(n * c + n * (n + 1) / 2 for n, c in zip(new_tokens, contexts, strict=True))
        return cls(
            sum(new_tokens), len(new_tokens), num_sampled, pairs, sum(contexts), transfer_time
        )

    @classmethod
    def prefill(cls, num_tokens: int, context: int = 0, sampled: bool = True) -> StepBatch:
        return cls.from_requests([num_tokens], [context], int(sampled))

    @classmethod
    def decode(cls, batch_size: int, context: int) -> StepBatch:
        """``batch_size`` requests each decoding one token after ``context`` cached tokens."""
        return cls.from_requests([1] * batch_size, [context] * batch_size, batch_size)


@dataclass(frozen=True)
class StepCost:
    flops: Amount
    bytes: Amount
    weight_bytes: Amount
    compute_time: Amount
    memory_time: Amount
    time: Amount


class CostModel:
    def __init__(
        self,
        gpu: GPUSpec | str,
        model: ModelSpec | str,
        calibration: Calibration | None = None,
        dtype: str = "bf16",
        kv_dtype: str = "bf16",
        speed: float = 1.0,
    ) -> None:
        if not speed > 0:
            raise ValueError(f"speed must be > 0, got {speed}")
        self.gpu = get_gpu(gpu) if isinstance(gpu, str) else gpu
        self.speed = speed
        self.model = get_model(model) if isinstance(model, str) else model
        self.calibration = calibration or load_calibration()
        self.dtype = dtype
        m, bpp = self.model, DTYPE_BYTES[dtype]
        self._flops_per_token = 2.0 * m.active_nonembedding_params
        self._flops_per_sample = 2.0 * m.lm_head_params
        self._flops_per_pair = 4.0 * m.num_layers * m.num_heads * m.head_dim
        self._kv_bytes = float(m.kv_bytes_per_token(kv_dtype))
        self._dense_weight_bytes = bpp * (
            m.num_layers * m.dense_params_per_layer + m.lm_head_params
        )
        self._expert_layer_bytes = bpp * m.num_layers * m.expert_params
        eff = self.calibration.efficiency(self.gpu)
        fp8_cores = dtype == "fp8" and self.gpu.fp8_flops is not None
        self._compute_rate = self.gpu.peak_flops(dtype) * eff.compute_efficiency(
            "fp8" if fp8_cores else "bf16"
        )
        self._attention_rate = self.gpu.bf16_flops * eff.eta_compute
        self._memory_rate = self.gpu.hbm_bandwidth * eff.eta_memory

    def weight_bytes(self, num_tokens: float | np.ndarray) -> float | np.ndarray:
        """Weight bytes read by a step of ``num_tokens`` tokens (MoE: touched experts only)."""
        m = self.model
        if not m.is_moe:
            return self._dense_weight_bytes + 0.0 * num_tokens
        miss = (1.0 - m.experts_per_token / m.num_experts) ** num_tokens
        touched = m.num_experts * (1.0 - miss)
        return self._dense_weight_bytes + self._expert_layer_bytes * touched

    def cost(self, batch: StepBatch) -> StepCost:
        """The step's cost; plain arithmetic, so a batch of floats is priced without numpy's
        per-call overhead (a step of the simulator) and a batch of arrays elementwise."""
        gemm_flops = (
            self._flops_per_token * batch.num_tokens + self._flops_per_sample * batch.num_sampled
        )
        attention_flops = self._flops_per_pair * batch.attention_pairs
        flops = gemm_flops + attention_flops
        weights = self.weight_bytes(batch.num_tokens)
        kv = self._kv_bytes * (batch.context_tokens + batch.num_tokens)
        nbytes = weights + kv
        # attention runs in bf16 even when the GEMMs run in fp8
        compute_time = gemm_flops / self._compute_rate + attention_flops / self._attention_rate
        expert_bytes = weights - self._dense_weight_bytes
        moe_penalty = expert_bytes * (1.0 / self.calibration.eta_moe - 1.0)
        memory_time = (nbytes + moe_penalty) / self._memory_rate
        cal = self.calibration
        overhead = cal.t_fixed + cal.t_per_seq * batch.num_seqs
        if self.speed != 1.0:  # a slower (or faster) instance than the calibrated one
            overhead = overhead / self.speed
            compute_time = compute_time / self.speed
            memory_time = memory_time / self.speed
        slower = (
            np.maximum(compute_time, memory_time)
            if isinstance(compute_time, np.ndarray)
            else max(compute_time, memory_time)
        )
        time = overhead + slower + batch.transfer_time
        return StepCost(flops, nbytes, weights, compute_time, memory_time, time)

    def step_time(self, batch: StepBatch) -> float:
        """Seconds one engine step takes (a batch of arrays: ``cost(batch).time``)."""
        return float(self.cost(batch).time)

    def decode_step_times(self, num_seqs: int, context_tokens: int, num_steps: int) -> np.ndarray:
        """Step times of ``num_steps`` consecutive decode-only steps.

        Step k has every one of ``num_seqs`` requests decode one token; before step 0 the
        requests hold ``context_tokens`` cached tokens in total, and each step adds one each.
        """
        k = np.arange(num_steps, dtype=float)
        ctx = context_tokens + num_seqs * k
        batch = StepBatch(num_seqs, num_seqs, num_seqs, ctx + num_seqs, ctx)
        return np.asarray(self.cost(batch).time, float) * np.ones(num_steps)

    def prefill_time(self, num_tokens: int, chunk: int | None = None, context: int = 0) -> float:
        """Seconds to prefill ``num_tokens`` alone, in chunks of ``chunk`` tokens (None = one)."""
        chunk = chunk or num_tokens
        total, done = 0.0, 0
        while done < num_tokens:
            n = min(chunk, num_tokens - done)
            last = done + n == num_tokens
            total += self.step_time(StepBatch.prefill(n, context + done, sampled=last))
            done += n
        return total
