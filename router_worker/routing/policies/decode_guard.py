"""The decode guard shared by the cache-affine policies (docs/algorithms.md, "The decode
guard").

A prefix cache hit makes the instance holding the prefix the cheapest place to prefill
every request that shares it; a rule that follows hits alone keeps sending them there
while their decode piles up, until that instance's steps (and then its KV cache) are full
and the rest of the fleet idles. The guard bounds it: a request may go only to instances
whose decode step, with the request joining it, would take at most ``decode_slack`` ×
the fastest instance's.

A decode step is memory-bound: it reads the weights once (a fixed cost), pays a little
per running request, and reads every running request's context from memory. Measured in
context tokens' worth of KV reads, the step on instance i with r joining costs::

    g_i = decode_fixed_tokens + decode_seq_tokens × (BS_i + 1) + ctx_i + prompt(r)

(``ctx_i``: the prompts of i's decoding requests, the view's ``decode_context_tokens``).
Only ratios matter, so the two parameters are the fleet's fixed step cost and per-request
cost over the KV read of one context token: the control plane derives them from the
cluster's GPU and model as it derives predicted_ttft's coefficients; left unset (a GPU or
model enginesim does not know, a config written by hand) they take the reference fleet's
values, :data:`REFERENCE_DECODE_COSTS` (16 × H20 serving Qwen2-7B). On an H20 the fixed
part is ~400k tokens' worth, so a batch of short requests never trips the guard while a
pile of long-context decodes does; on GPUs with less bandwidth per FLOP the KV reads
weigh more and it trips sooner, as the engine slows sooner.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from router_worker.routing.features import RequestFeatures
from router_worker.routing.indicators import ClusterView
from router_worker.routing.kv_pressure import OutputLengths
from router_worker.routing.policies.base import PolicyParams, RoutingPolicy
from router_worker.routing.provenance import derived, design

# enginesim's cost model for an H20 serving Qwen2-7B, as the control plane derives them
# (enginesim.replay.policy_costs.derive_decode_costs("h20", "qwen2-7b")).
REFERENCE_DECODE_COSTS: dict[str, float] = {
    "decode_fixed_tokens": 397100.0,
    "decode_seq_tokens": 10790.0,
}
DECODE_COST_FIELDS: tuple[str, ...] = tuple(REFERENCE_DECODE_COSTS)

# where decode_slack was checked (it was not swept on the matrix)
GUARD_CHECKED_ON = "a long-output burst on H100, A100 and L40S fleets; matrix cells unchanged"
_DERIVED = "blank = derived from the cluster's GPU and model (H20 + Qwen2-7B: {})"


class DecodeGuardParams(PolicyParams):
    decode_slack: float | None = Field(
        2.0,
        ge=1.0,
        le=1000.0,
        description="decode guard: only instances whose decode step with the request "
        "would take at most this factor × the fastest one's are candidates (a cache hit "
        "must not pile decode onto the instances holding a prefix); null = no guard",
        json_schema_extra=design(
            "the long-output burst on H100, A100 and L40S fleets; matrix cells unchanged"
        ),
    )
    kv_pressure: bool = Field(
        True,
        description="count every request dispatched to an instance against its decode step "
        "and its KV from dispatch to finish (not only once it decodes), and choose only "
        "among instances whose KV holds the request with its expected output while one "
        'does (docs/algorithms.md, "KV pressure"); off = the decode guard sees the '
        "decoding requests only, and KV is not checked",
        json_schema_extra=design(),
    )
    decode_fixed_tokens: float | None = Field(
        None,
        gt=0.0,
        description="decode guard: a decode step's fixed cost (weights read, launch) in "
        "context tokens' worth of KV reads; " + _DERIVED.format("397100"),
        json_schema_extra=derived(),
    )
    decode_seq_tokens: float | None = Field(
        None,
        ge=0.0,
        description="decode guard: what each running request adds to a decode step "
        "beyond reading its context, in context tokens' worth; " + _DERIVED.format("10790"),
        json_schema_extra=derived(),
    )


def decode_costs(params: DecodeGuardParams) -> tuple[float, float]:
    """(fixed, per-request) in context tokens, unset ones at the reference fleet's."""
    fixed = params.decode_fixed_tokens
    seq = params.decode_seq_tokens
    return (
        REFERENCE_DECODE_COSTS["decode_fixed_tokens"] if fixed is None else fixed,
        REFERENCE_DECODE_COSTS["decode_seq_tokens"] if seq is None else seq,
    )


def decode_load(
    request: RequestFeatures, view: ClusterView, params: DecodeGuardParams
) -> np.ndarray:
    """Per slot, the decode step ``request`` would join, in context tokens (g_i above)."""
    fixed, seq = decode_costs(params)
    if params.kv_pressure:  # every request taken on, queued or decoding
        joined = view.committed_batch + 1.0
        context = view.committed_context_tokens
    else:
        joined = view.batch_size + 1.0
        context = view.decode_context_tokens
    return fixed + seq * joined + context + request.prompt_tokens


def decode_headroom(
    request: RequestFeatures, view: ClusterView, allowed: np.ndarray, params: DecodeGuardParams
) -> np.ndarray:
    """The allowed slots within the guard's bound (every allowed slot with the guard off)."""
    slack = params.decode_slack
    if slack is None:
        return allowed
    load = decode_load(request, view, params)
    return allowed & (load <= slack * float(load[allowed].min()))


class DecodeGuardedPolicy(RoutingPolicy):
    """A policy with the decode guard: it learns output lengths from its feedback (the
    guard's and KV pressure's expected output, :class:`OutputLengths`)."""

    def __init__(self, params: PolicyParams | None = None, seed: int = 0) -> None:
        super().__init__(params, seed)
        self.outputs = OutputLengths()

    def observe_first_token(
        self, request: RequestFeatures, instance_id: str, ttft: float, now: float
    ) -> None:
        self.outputs.first_token(request.request_id, now)

    def observe_finish(
        self, request: RequestFeatures, instance_id: str, output_tokens: int, now: float
    ) -> None:
        self.outputs.finish(request.request_id, output_tokens, now)
