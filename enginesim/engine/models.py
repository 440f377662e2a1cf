"""Model specifications: layer shapes from each model's Hugging Face ``config.json``.

Parameter counts are derived from the shapes (q/k/v/o projections, SwiGLU MLP or
experts, router, untied embedding + LM head); norms and biases are ignored (<0.1 %).

| key           | layers | hidden | heads/kv | head | MLP width        | vocab  | max len |
|---------------|--------|--------|----------|------|------------------|--------|---------|
| qwen2-7b      | 28     | 3584   | 28/4     | 128  | 18944            | 152064 | 32768   |
| qwen2.5-7b    | 28     | 3584   | 28/4     | 128  | 18944            | 152064 | 32768   |
| qwen3-30b-a3b | 48     | 2048   | 32/4     | 128  | 128 x 768, top-8 | 151936 | 40960   |
| llama-3.1-8b  | 32     | 4096   | 32/8     | 128  | 14336            | 128256 | 131072  |
| qwen3-8b      | 36     | 4096   | 32/8     | 128  | 12288            | 151936 | 40960   |
| qwen3-32b     | 64     | 5120   | 64/8     | 128  | 25600            | 151936 | 40960   |

Served names: Qwen/Qwen2-7B-Instruct, Qwen/Qwen2.5-7B-Instruct, Qwen/Qwen3-30B-A3B,
meta-llama/Llama-3.1-8B-Instruct, Qwen/Qwen3-8B, Qwen/Qwen3-32B (config.json of each on
huggingface.co is the source of every shape).

Derived: Qwen2-7B 7.6 B params, 56 KiB KV/token (bf16); Qwen3-30B-A3B 30.5 B total,
3.3 B active, 96 KiB KV/token; Llama-3.1-8B 8.0 B, 128 KiB; Qwen3-8B 8.2 B, 144 KiB;
Qwen3-32B 32.8 B, 256 KiB.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1}


@dataclass(frozen=True)
class ModelSpec:
    key: str
    served_name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # dense MLP width; for MoE the per-expert width
    vocab_size: int
    max_model_len: int
    num_experts: int = 0  # 0 = dense
    experts_per_token: int = 0
    source: str = ""

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @cached_property
    def attention_params_per_layer(self) -> int:
        q_out = self.num_heads * self.head_dim
        kv_out = self.num_kv_heads * self.head_dim
        return self.hidden_size * (2 * q_out + 2 * kv_out)

    @cached_property
    def expert_params(self) -> int:
        """Parameters of one SwiGLU MLP (one expert for MoE models)."""
        return 3 * self.hidden_size * self.intermediate_size

    @cached_property
    def router_params_per_layer(self) -> int:
        return self.hidden_size * self.num_experts

    @cached_property
    def dense_params_per_layer(self) -> int:
        """Parameters every token touches in a layer (attention, router, dense MLP)."""
        mlp = 0 if self.is_moe else self.expert_params
        return self.attention_params_per_layer + self.router_params_per_layer + mlp

    @cached_property
    def lm_head_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @cached_property
    def total_params(self) -> int:
        experts = self.num_experts * self.expert_params if self.is_moe else 0
        per_layer = self.dense_params_per_layer + experts
        return self.num_layers * per_layer + 2 * self.lm_head_params

    @cached_property
    def active_nonembedding_params(self) -> int:
        """Parameters multiplied per token, excluding embedding and LM head."""
        experts = self.experts_per_token * self.expert_params if self.is_moe else 0
        return self.num_layers * (self.dense_params_per_layer + experts)

    def weight_bytes(self, dtype: str = "bf16") -> int:
        return self.total_params * DTYPE_BYTES[dtype]

    def kv_bytes_per_token(self, kv_dtype: str = "bf16") -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * DTYPE_BYTES[kv_dtype]


def _qwen2_7b(key: str, served: str, source: str) -> ModelSpec:
    return ModelSpec(key, served, 28, 3584, 28, 4, 128, 18944, 152064, 32768, source=source)


MODELS: dict[str, ModelSpec] = {
    "qwen2-7b": _qwen2_7b(
        "qwen2-7b", "Qwen/Qwen2-7B-Instruct", "hf.co/Qwen/Qwen2-7B-Instruct config.json"
    ),
    "qwen2.5-7b": _qwen2_7b(
        "qwen2.5-7b", "Qwen/Qwen2.5-7B-Instruct", "hf.co/Qwen/Qwen2.5-7B-Instruct config.json"
    ),
    "qwen2.5-14b": ModelSpec(
        "qwen2.5-14b",
        "Qwen/Qwen2.5-14B-Instruct",
        48,
        5120,
        40,
        8,
        128,
        13824,
        152064,
        32768,
        source="hf.co/Qwen/Qwen2.5-14B-Instruct config.json",
    ),
    "qwen3-30b-a3b": ModelSpec(
        "qwen3-30b-a3b",
        "Qwen/Qwen3-30B-A3B",
        48,
        2048,
        32,
        4,
        128,
        768,
        151936,
        40960,
        num_experts=128,
        experts_per_token=8,
        source="hf.co/Qwen/Qwen3-30B-A3B config.json",
    ),
    "llama-3.1-8b": ModelSpec(
        "llama-3.1-8b",
        "meta-llama/Llama-3.1-8B-Instruct",
        32,
        4096,
        32,
        8,
        128,
        14336,
        128256,
        131072,
        source="hf.co/meta-llama/Llama-3.1-8B-Instruct config.json",
    ),
    "qwen3-8b": ModelSpec(
        "qwen3-8b",
        "Qwen/Qwen3-8B",
        36,
        4096,
        32,
        8,
        128,
        12288,
        151936,
        40960,
        source="hf.co/Qwen/Qwen3-8B config.json",
    ),
    "qwen3-32b": ModelSpec(
        "qwen3-32b",
        "Qwen/Qwen3-32B",
        64,
        5120,
        64,
        8,
        128,
        25600,
        151936,
        40960,
        source="hf.co/Qwen/Qwen3-32B config.json",
    ),
}


def get_model(key: str) -> ModelSpec:
    try:
        return MODELS[key.lower()]
    except KeyError:
        raise KeyError(f"unknown model {key!r}; known: {sorted(MODELS)}") from None
