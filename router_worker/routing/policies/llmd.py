"""``llmd`` and ``llmd_precise``: the llm-d inference scheduler's two shipped paths.

These are baselines: the router an operator running llm-d would have instead of ours,
emulated from llm-d's public source (docs/algorithms.md, "llmd" names the files read).

``llmd``, its out-of-the-box scheduling profile (no configuration file): three scorers,
each in [0, 1] per candidate, summed with the weights llm-d ships, and the maximum wins
(ties: seeded random, as its max-score picker shuffles before picking)::

    score_i = 2 · queue_i + 2 · kv_i + 3 · prefix_i
    queue_i  = (max_q − q_i) / (max_q − min_q)   (1 for every candidate when all q are equal)
    kv_i     = 1 − KV-cache usage_i               (the engine's scraped fraction)
    prefix_i = matched_blocks_i / total_blocks    (0 when the prompt has no full block)

``q_i`` is the engine's waiting queue as last scraped (``vllm:num_requests_waiting``);
a never-scraped engine reads 0 waiting and 0 usage. ``total_blocks`` counts the prompt's
full blocks, at most ``max_prefix_blocks``; ``matched_blocks_i`` the leading ones instance
i holds.

``llmd_precise``, its precise-prefix + token-load path: a prefix-cache affinity filter fed
by the engines' KV events, then the token-load scorer, the maximum winning (seeded random
among ties):

1. sticky = candidates whose prefix score (as above, uncapped) ≥ ``affinity_threshold``;
   none sticky → keep every candidate (reason ``no_sticky``).
2. TTFT gate: each candidate's queue delay is its in-flight prefill tokens (dispatched, no
   first token yet) ÷ ``prefill_tps`` (llm-d's peakPrefillThroughput); if the best sticky
   one's exceeds the best non-sticky one's by more than ``max_ttft_penalty_s`` → keep
   every candidate (reason ``load_override``); else keep the sticky ones (``sticky``).
3. token load_i = in-flight prefill tokens_i + the request's uncached tokens on i (its
   P-token); score_i = 1 − min(load_i, ``queue_threshold_tokens``) / ``queue_threshold_tokens``.

Scores reported per instance: the negated weighted sum (``llmd``) or negated token-load
score (``llmd_precise``), so lower is better as everywhere else.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from router_worker.routing.features import RequestFeatures
from router_worker.routing.indicators import ClusterView
from router_worker.routing.policies.base import Decision, PolicyParams, RoutingPolicy
from router_worker.routing.provenance import derived, paper

LLMD = "llm-d inference scheduler"
# llm-d's prefix-cache-affinity-filter default, calibrated for Qwen3-32B on 2 × H100 (TP=2);
# used when the cluster's own figure was not derived (unknown hardware).
LLMD_PEAK_PREFILL_TPS = 15928.0


class LlmdParams(PolicyParams):
    queue_weight: float = Field(
        2.0,
        ge=0,
        description="weight of the queue scorer (shorter scraped waiting queue scores higher)",
        json_schema_extra=paper(LLMD),
    )
    kv_cache_weight: float = Field(
        2.0,
        ge=0,
        description="weight of the KV-cache utilisation scorer (1 − scraped KV usage)",
        json_schema_extra=paper(LLMD),
    )
    prefix_weight: float = Field(
        3.0,
        ge=0,
        description="weight of the prefix-cache scorer (share of the prompt's blocks cached)",
        json_schema_extra=paper(LLMD),
    )
    max_prefix_blocks: int = Field(
        256,
        ge=1,
        description="the prefix scorer looks at most this many leading blocks of a prompt",
        json_schema_extra=paper(LLMD),
    )


class LlmdPreciseParams(PolicyParams):
    affinity_threshold: float = Field(
        0.8,
        ge=0.0,
        le=1.0,
        description="an instance holding at least this share of the prompt's blocks is "
        "sticky: the request stays among the sticky instances unless the TTFT gate opens",
        json_schema_extra=paper(LLMD),
    )
    max_ttft_penalty_s: float = Field(
        18.0,
        ge=0.0,
        description="the gate opens (every instance is considered) when the best sticky "
        "instance's queued prefill takes this much longer than the best other one's; "
        "0 = always stick",
        json_schema_extra=paper(LLMD),
    )
    prefill_tps: float | None = Field(
        None,
        gt=0,
        description="prefill tokens/s an instance drains, to turn queued prefill tokens into "
        "seconds for the gate; blank = derived from the cluster's GPU and model "
        f"(llm-d's own default, {LLMD_PEAK_PREFILL_TPS:g}, on unknown hardware)",
        json_schema_extra=derived(),
    )
    queue_threshold_tokens: int = Field(
        4_194_304,
        ge=1,
        description="token load at which the token-load scorer reaches 0 (it falls linearly "
        "from 1 at no load)",
        json_schema_extra=paper(LLMD),
    )


def prefix_score(view: ClusterView, request: RequestFeatures, cap: int | None) -> np.ndarray:
    """Per slot, the share of the prompt's full blocks (at most ``cap``) held there."""
    total = request.prompt_tokens // view.block_size
    if cap is not None:
        total = min(total, cap)
    if total <= 0:
        return np.zeros(view.size)
    return np.minimum(view.cached_blocks(request), total) / total


class LlmdPolicy(RoutingPolicy):
    kind = "llmd"
    description = "llm-d's default profile: queue, KV-utilisation and prefix scorers, 2:2:3."
    Params = LlmdParams
    params: LlmdParams

    def decide(self, request: RequestFeatures, view: ClusterView, now: float) -> Decision:
        allowed = self.eligible_mask(view)
        p = self.params
        score = (
            p.queue_weight * _queue_score(view, allowed)
            + p.kv_cache_weight * (1.0 - view.kv_usage_or_zero)
            + p.prefix_weight * prefix_score(view, request, p.max_prefix_blocks)
        )
        slot = self.pick_min((-score,), allowed)
        return self.decision(view, request, slot, "score", -score, allowed)


class LlmdPrecisePolicy(RoutingPolicy):
    kind = "llmd_precise"
    description = "llm-d's precise-prefix path: KV-event affinity filter, then token load."
    Params = LlmdPreciseParams
    params: LlmdPreciseParams

    def decide(self, request: RequestFeatures, view: ClusterView, now: float) -> Decision:
        allowed = self.eligible_mask(view)
        keep, reason = self._affinity(view, request, allowed)
        threshold = float(self.params.queue_threshold_tokens)
        load = np.minimum(view.p_tokens(request), threshold)
        score = 1.0 - load / threshold
        slot = self.pick_min((-score,), keep)
        return self.decision(view, request, slot, reason, -score, keep)

    def _affinity(
        self, view: ClusterView, request: RequestFeatures, allowed: np.ndarray
    ) -> tuple[np.ndarray, str]:
        """The candidates llm-d's prefix-cache affinity filter keeps, and why."""
        p = self.params
        if int(allowed.sum()) <= 1 or p.affinity_threshold <= 0:
            return allowed, "not_applicable"
        sticky = allowed & (prefix_score(view, request, None) >= p.affinity_threshold)
        if not sticky.any():
            return allowed, "no_sticky"
        others = allowed & ~sticky
        if p.max_ttft_penalty_s > 0 and others.any():
            rate = p.prefill_tps or LLMD_PEAK_PREFILL_TPS
            delay = view.pending_prefill / rate
            if float(delay[sticky].min()) - float(delay[others].min()) > p.max_ttft_penalty_s:
                return allowed, "load_override"
        return sticky, "sticky"


def _queue_score(view: ClusterView, allowed: np.ndarray) -> np.ndarray:
    """llm-d's queue scorer: the scraped waiting queue, min-max normalised over candidates."""
    waiting = np.nan_to_num(view.scraped_waiting, nan=0.0)
    low, high = float(waiting[allowed].min()), float(waiting[allowed].max())
    if high == low:
        return np.ones(view.size)
    return (high - waiting) / (high - low)
