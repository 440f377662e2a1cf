"""Prefill/decode disaggregation at the router: instance roles, the stages' eligibility,
and the decider that chooses, per request, whether to split it.

A disaggregated cluster has instances of role ``prefill``, ``decode`` and ``both``. A
split request is two attempts of one plan: a prefill attempt on the prefill pool
(``prefill`` and ``both`` instances), then a decode attempt on the decode pool (``decode``
and ``both``) that reads the prefill's KV. A colocated request is one attempt on the
decode pool, which computes the prompt itself (as llm-d does when it skips the prefill).

The decider (pure: features, the two pools' views, parameters; no clock, no I/O):

* ``always`` / ``never``: every request split / none.
* ``prefix_threshold``: llm-d's rule, split when the prompt's part not cached on the
  decode pool (its best hit) exceeds a fixed token threshold.
* ``cost`` (the default): split when it spares a decode batch more than it costs the
  request. Colocated on the decode instance it would go to (the smallest batch), the
  request's uncached prompt stalls every request decoding there for ``uncached_d /
  prefill_tps_d`` seconds, and its own first token comes after ``P-token_d / tps_d``.
  Split, its first token comes after the prefill pool's best ``P-token_p / tps_p`` plus
  the KV read (``latency + (prompt − 1) × kv_bytes_per_token / link_bandwidth``). It is
  split when the decode instance has a batch to spare and the split delays the request's
  first token by no more than colocation would stall each of its batch-mates. Every term
  comes from the live view (pending prefill, batch sizes, learned prefill throughput, KV
  hits) or the cost model (KV bytes per token, link), so the threshold moves with load:
  short uncached prompts, an idle decode pool or a congested prefill pool keep requests
  colocated. A request also stays colocated when no decode instance has KV room for it
  (the decode pool is the bottleneck: a read would wait for room).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from router_worker.routing.features import RequestFeatures
from router_worker.routing.indicators import ClusterState, ClusterView, Health

ROLES = ("prefill", "decode", "both")
Role = Literal["prefill", "decode", "both"]
DeciderKind = Literal["always", "never", "prefix_threshold", "cost"]

# Qwen2-7B's KV bytes per token (28 layers × 4 KV heads × 128 × 2 × bf16) and a 400 Gb/s
# RDMA link: the reference fleet's, used until the control plane derives them.
REFERENCE_KV_BYTES_PER_TOKEN = 57_344
REFERENCE_LINK_BANDWIDTH = 50e9
REFERENCE_LINK_LATENCY = 20e-6


_HEALTHY = int(Health.HEALTHY)


class MemberView(ClusterView):
    """The shared cluster view with eligibility restricted to some slots (a canary arm's
    instances, a pool); the live router and the simulator build their pools with it."""

    def __init__(self, state: ClusterState, members: np.ndarray) -> None:
        super().__init__(state)
        self.members = members

    def _eligible_mask(self) -> np.ndarray:
        return (self.health == _HEALTHY) & self.members


def pool_views(state: ClusterState, roles: dict[str, str]) -> tuple[MemberView, MemberView]:
    """The prefill pool's and the decode pool's views of ``state`` (``roles``: by
    instance id; instances not named are in neither)."""

    def members(test: Callable[[str], bool]) -> np.ndarray:
        return np.array([test(roles.get(name, "")) for name in state.ids], dtype=bool)

    return (
        MemberView(state, members(in_prefill_pool)),
        MemberView(state, members(in_decode_pool)),
    )


def in_prefill_pool(role: str) -> bool:
    return role in ("prefill", "both")


def in_decode_pool(role: str) -> bool:
    return role in ("decode", "both")


class DeciderParams(BaseModel):
    """How the router chooses between colocated and split, per request."""

    model_config = ConfigDict(extra="forbid")

    kind: DeciderKind = Field(
        "cost",
        description="always, never, prefix_threshold (llm-d's fixed threshold) or cost "
        "(the live cost of colocation against the split's)",
    )
    threshold_tokens: int = Field(
        256,
        ge=0,
        description="prefix_threshold: split when more prompt tokens than this are "
        "uncached on the decode pool",
    )
    kv_bytes_per_token: int = Field(
        REFERENCE_KV_BYTES_PER_TOKEN, ge=1, description="cost: the model's KV bytes per token"
    )
    link_bandwidth: float = Field(
        REFERENCE_LINK_BANDWIDTH, gt=0, description="cost: prefill→decode link, bytes/s"
    )
    link_latency: float = Field(
        REFERENCE_LINK_LATENCY, ge=0, description="cost: per-read latency of the link, s"
    )


@dataclass(frozen=True, slots=True)
class SplitDecision:
    split: bool
    reason: str  # always | never | threshold | short | cost | no_room | no_pool
    uncached: int  # prompt tokens not cached on the decode pool's best instance
    # s of stall per decoding batch-mate the split spares: colocation's on the decode
    # instance less the prefill's own where it decodes too (0 or less: nothing spared)
    colocation_cost: float = 0.0
    split_cost: float = 0.0  # s the split delays this request's first token (may be < 0)


def _best(mask: np.ndarray, values: np.ndarray) -> float:
    return float(values[mask].min()) if mask.any() else float("inf")


def decide_split(
    params: DeciderParams,
    request: RequestFeatures,
    prefill: ClusterView,
    decode: ClusterView,
) -> SplitDecision:
    """Whether ``request`` is split, over the prefill and decode pools' views."""
    prefill_ok, decode_ok = prefill.eligible, decode.eligible
    cached = decode.cached_tokens(request)
    uncached = int(request.prompt_tokens - (cached[decode_ok].max() if decode_ok.any() else 0))
    if not prefill_ok.any() or not decode_ok.any():
        return SplitDecision(False, "no_pool", uncached)
    if params.kind == "always":
        return SplitDecision(True, "always", uncached)
    if params.kind == "never":
        return SplitDecision(False, "never", uncached)
    if params.kind == "prefix_threshold":
        return SplitDecision(uncached > params.threshold_tokens, "threshold", uncached)
    return _by_cost(params, request, prefill, decode, uncached)


def _by_cost(
    params: DeciderParams,
    request: RequestFeatures,
    prefill: ClusterView,
    decode: ClusterView,
    uncached: int,
) -> SplitDecision:
    decode_ok = decode.eligible
    need = -(-request.prompt_tokens // decode.block_size)
    free = decode.capacity_blocks * (1.0 - decode.kv_usage_or_zero)
    if not (decode_ok & (free >= need)).any():
        return SplitDecision(False, "no_room", uncached)
    # The decode instance a colocated request would go to: the smallest batch's.
    batch = np.asarray(decode.batch_size, dtype=float)
    slot = int(np.flatnonzero(decode_ok)[np.argmin(batch[decode_ok])])
    tps_d = float(decode.prefill_tps[slot])
    stall = float(decode.new_tokens(request)[slot]) / tps_d  # each batch-mate waits this
    colocated_first = float(decode.p_tokens(request)[slot]) / tps_d
    read = params.link_latency + (
        max(request.prompt_tokens - 1, 0) * params.kv_bytes_per_token / params.link_bandwidth
    )
    # The prefill goes to the prefill pool's soonest instance, p ...
    prefill_s = np.where(prefill.eligible, prefill.p_tokens(request) / prefill.prefill_tps, np.inf)
    p = int(np.argmin(prefill_s))
    split_first = float(prefill_s[p]) + read
    # ... and its last token is computed on the decode instance behind what is queued there.
    split_first += float(decode.pending_prefill[slot]) / tps_d
    colocation = stall if batch[slot] > 0 else 0.0
    # An instance of role both that decodes stalls its own batch for the prefill as d's
    # would: the split spares d's batch that stall only to put one on p's.
    decodes_at_p = bool(decode_ok[p]) and batch[p] > 0
    moved = (
        float(prefill.new_tokens(request)[p]) / float(prefill.prefill_tps[p])
        if decodes_at_p
        else 0.0
    )
    spared = colocation - moved
    # Split when it spares a batch a stall and delays this request's first token by no more
    # than that stall would have delayed each of the batch's tokens.
    split_cost = split_first - colocated_first
    split = spared > 0 and split_cost <= spared
    return SplitDecision(split, "cost", uncached, spared, split_cost)
