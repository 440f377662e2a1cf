"""Engine configuration with vLLM's defaults."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from enginesim.engine.costmodel import Calibration, CostModel, load_calibration
from enginesim.engine.hardware import GIB, GPUSpec, get_gpu
from enginesim.engine.kvpool import GlobalKVTier
from enginesim.engine.models import DTYPE_BYTES, ModelSpec, get_model
from enginesim.engine.transfer import DEFAULT_HOLD_TIMEOUT, LINKS, LinkSpec, get_link

# vLLM's defaults for the OpenAI server: 8192 tokens / 1024 seqs on GPUs with >= 70 GiB,
# except the A100 (vLLM matches "a100" in the device name), 2048 / 256 elsewhere.
LARGE_GPU_BYTES = 70 * GIB
NON_TORCH_RESERVE = 1 * GIB  # CUDA context, NCCL, CUDA graphs


@dataclass
class EngineConfig:
    gpu: GPUSpec
    model: ModelSpec
    block_size: int = 16
    max_num_batched_tokens: int = 0  # 0 = vLLM default for the GPU
    max_num_seqs: int = 0  # 0 = vLLM default for the GPU
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks: int = 0  # 0 = derived from memory
    enable_prefix_caching: bool = True
    global_tier: GlobalKVTier | None = None
    dtype: str = "bf16"
    kv_dtype: str = "bf16"
    max_model_len: int = 0  # 0 = the model's
    reserve_bytes: int = -1  # -1 = estimate of vLLM's profiled activations + non-torch memory
    calibration: Calibration = field(default_factory=load_calibration)
    # How this instance departs from the calibrated engine (enginesim.engine.fleet): its
    # steps' GPU time is divided by ``speed`` and, with ``step_jitter`` > 0, multiplied
    # per step by a lognormal factor of mean 1 and log-sd ``step_jitter`` drawn from a
    # generator seeded with ``jitter_seed``.
    speed: float = 1.0
    step_jitter: float = 0.0
    jitter_seed: int = 0
    # Prefill/decode disaggregation (enginesim.engine.transfer): the link this instance
    # reads remote KV over, and how long it holds a finished prefill's blocks for a read.
    kv_link: LinkSpec = field(default_factory=lambda: LINKS["rdma"])
    kv_hold_timeout: float = DEFAULT_HOLD_TIMEOUT

    def __post_init__(self) -> None:
        if not (0 < self.speed < math.inf):
            raise ValueError(f"speed must be a positive number, got {self.speed}")
        if not (0 <= self.step_jitter < math.inf):
            raise ValueError(f"step_jitter must be >= 0, got {self.step_jitter}")
        if not (0 < self.kv_hold_timeout < math.inf):
            raise ValueError(
                f"kv_hold_timeout must be a positive number, got {self.kv_hold_timeout}"
            )
        if isinstance(self.kv_link, str):
            self.kv_link = get_link(self.kv_link)
        if isinstance(self.gpu, str):
            self.gpu = get_gpu(self.gpu)
        if isinstance(self.model, str):
            self.model = get_model(self.model)
        large = self.gpu.memory_bytes >= LARGE_GPU_BYTES and "a100" not in self.gpu.name.lower()
        self.max_num_batched_tokens = self.max_num_batched_tokens or (8192 if large else 2048)
        self.max_num_seqs = self.max_num_seqs or (1024 if large else 256)
        self.max_model_len = self.max_model_len or self.model.max_model_len
        if self.reserve_bytes < 0:
            self.reserve_bytes = self._estimated_reserve()
        self.num_gpu_blocks = self.num_gpu_blocks or self._derived_num_blocks()
        if self.num_gpu_blocks <= 0:
            raise ValueError(f"{self.model.key} does not fit on {self.gpu.key}: no KV blocks")

    @classmethod
    def for_hardware(cls, gpu: str, model: str, **overrides: Any) -> EngineConfig:
        return cls(gpu=get_gpu(gpu), model=get_model(model), **overrides)

    @property
    def block_bytes(self) -> int:
        return self.block_size * self.model.kv_bytes_per_token(self.kv_dtype)

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size

    def cost_model(self) -> CostModel:
        return CostModel(
            self.gpu, self.model, self.calibration, self.dtype, self.kv_dtype, speed=self.speed
        )

    def _estimated_reserve(self) -> int:
        """Peak activations of a max-size profiling batch (MLP intermediates) plus the
        sampler's fp32 logits for max_num_seqs rows, plus non-torch memory."""
        m = self.model
        mlp_width = m.intermediate_size * max(1, m.experts_per_token)
        activations = self.max_num_batched_tokens * 2 * mlp_width * 2
        logits = self.max_num_seqs * m.vocab_size * 4
        return NON_TORCH_RESERVE + activations + logits

    def _derived_num_blocks(self) -> int:
        budget = self.gpu.memory_bytes * self.gpu_memory_utilization
        weights = self.model.total_params * DTYPE_BYTES[self.dtype]
        return int((budget - weights - self.reserve_bytes) // self.block_bytes)
