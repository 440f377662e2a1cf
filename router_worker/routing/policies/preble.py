"""``preble``: Preble's E2 global scheduling rule (docs/algorithms.md, "preble").

Per request, with ``matched`` = the longest local prefix hit over healthy
instances and ``new = prompt − matched``:

* **exploit** when ``matched > new``: among the instances holding that longest
  match, the one with the least load cost;
* **explore** otherwise: the least load cost over all healthy instances, unless
  the prefill/decode balancing rule below applies (``pd_balance``).

Load cost of instance i (in prefill-token equivalents) =
``window_i + decode_i + evict_i(r) + new_i(r)``:

* ``window_i``, the history term: the uncached prompt tokens of the requests
  assigned to i in the last ``window_s`` seconds (Preble's H).
* ``decode_i``, the decode term: the requests in flight on i (dispatched, not
  finished) × one request's decode time there, as Preble's global scheduler
  prices it (``SlidingWindowHistogram.get_node_cost`` in WukLab/preble's
  ``preble/global_scheduler_with_time.py``: a node's in-flight requests on the
  GPU × its output length × the GPU's median TPOT). One request's decode time
  on i = the running mean output length reported through ``observe_finish`` ×
  the median of i's last ``tpot_samples`` TPOTs ((finish − first token) ÷
  (output tokens − 1), from ``observe_first_token`` and ``observe_finish``);
  converted to prefill tokens at the cluster's prefill throughput (the median
  of the view's measured ``prefill_tps``; Preble prices prefill in seconds with
  a per-model/GPU regression a router cannot run). A decode token therefore
  weighs what a decode step takes, not a batch's share of it (Qwen2-7B on an
  H20 at low load: a 6.5 ms step ≈ 50 prefill tokens). An instance with no
  TPOT measured yet prices a decode token at ``decode_token_weight`` prefill
  tokens; before any finish one request's decode costs
  ``decode_cost_tokens``.
* ``evict_i(r)``, the eviction term: the recompute cost of the cached tokens i
  would evict to make room for r, each × the share of the window's requests
  that used it. Preble simulates the eviction on its radix tree and sums, over
  the evicted nodes, node tokens × (requests in H that shared the node ÷
  requests in H). We approximate it with what the KV index exposes: i's
  modelled cache holds ``held_i`` of ``capacity_i`` blocks, so r (which adds
  its blocks i does not hold) evicts ``E_i = max(held_i + r's missing blocks −
  capacity_i, 0)`` blocks. The evicted tokens are priced at the mean share of a
  cached token of i: Σ over window requests routed to i of their hit tokens on
  i, ÷ (held tokens of i × requests in the window) — exactly Preble's
  Σ tokens(n)·share(n) ÷ Σ tokens(n) over i's cached nodes, assuming the
  evicted tokens are a uniform draw from them (LRU evicts the least recently
  used ones, so this overestimates; capped at 1 per token). Scaled by
  ``eviction_weight`` (0 turns the term off).
* ``new_i(r)``: r's own prefill on i.

Prefill/decode balancing (explore branch only, where r is prefill-heavy since
``new ≥ matched``): instance i's decode ratio is its decode load ÷ its load
(decode_i ÷ (window_i + decode_i); 0 when both are 0). If
some healthy instance's ratio exceeds ``pd_ratio_threshold``, r goes to the
instance with the largest ratio (ties: lower cost, then pending prefill) —
prefill fills the compute a decode-bound GPU leaves idle (``pd_balance``).

Post-assignment rebalancing: if the chosen instance's load (window_i +
decode_i) is at least ``th_bal`` × the smallest load (that smallest floored at
``min_cost_floor_tokens`` so a nearly idle cluster does not bounce on noise),
the request goes to the least-cost instance instead (``rebalance``).

Hot-prefix replication: a prefix is keyed by the first ``min(matched blocks,
prefix_key_blocks)`` blocks of the longest match (a shared system prompt or
document, not each conversation's own tail, so requests sharing it pool their
samples). TTFTs fed back through ``observe_first_token`` for requests sent by
exploit (or replicate) are kept per (prefix, instance), as Preble's overload
detector keeps them per (prefix node, GPU) (``TTFTWindowedOverloadedDetector``
in WukLab/preble's ``preble/ttft_overload_detector.py``): a prefix is hot *on
the instance serving it*, so an exploit looks at the TTFTs of the holder it
chose. The baseline adapts: time is cut into consecutive sub-windows of length
H; each sub-window with at least ``min_samples`` TTFTs contributes its mean,
and the baseline is the least of the last ``baseline_windows`` such means (the
prefix's best recent level there, so a slow drift moves it and one noisy
sub-window does not). When the mean TTFT over the sliding window H (at least
``min_samples`` TTFTs) reaches ``replicate_ttft_factor`` × baseline, the next
request of that prefix that would go there goes to the least-cost instance
*not* holding the match (``replicate``), and the sliding window restarts
(another replica needs ``min_samples`` fresh TTFTs that are still degraded);
the baseline history is kept. Nothing fires before one sub-window of history
exists.
Ties everywhere: lower pending prefill, then seeded random.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from math import floor
from typing import TypeVar

import numpy as np
from pydantic import Field

from router_worker.routing.features import RequestFeatures
from router_worker.routing.indicators import ClusterView
from router_worker.routing.policies.base import Decision, PolicyParams, RoutingPolicy
from router_worker.routing.provenance import design, paper

_MAX_TRACKED_REQUESTS = 100_000
_K = TypeVar("_K")
_V = TypeVar("_V")


class PrebleParams(PolicyParams):
    window_s: float = Field(
        180.0,
        gt=0,
        le=86_400,
        description="Preble's history window H in seconds: the prefill load of an instance "
        "sums the requests assigned to it in the last H seconds; also the TTFT window of "
        "replication.",
        json_schema_extra=paper("Preble"),
    )
    th_bal: float = Field(
        1.5,
        ge=1.0,
        le=100,
        description="Rebalance: if the chosen instance's load (windowed prefill + in-flight "
        "decode) is at least th_bal × the smallest, send the request to the least-loaded "
        "instance instead.",
        json_schema_extra=paper("Preble"),
    )
    decode_cost_tokens: float = Field(
        128.0,
        ge=0,
        le=1e7,
        description="Prior decode cost of one request, in prefill-token equivalents, used "
        "until the first finished request reports its output length.",
        json_schema_extra=design(),
    )
    decode_token_weight: float = Field(
        50.0,
        ge=0,
        le=10_000,
        description="Prior price of one decode token in prefill tokens, on an instance whose "
        "TPOT has not been measured yet (then: its median TPOT × the cluster's prefill "
        "throughput). Default: Qwen2-7B on H20 at low load (a 6.5 ms decode step × 7,200 "
        "prefill tokens/s ≈ 47).",
        json_schema_extra=design(on="H20, Qwen2-7B at low load"),
    )
    tpot_samples: int = Field(
        200,
        ge=1,
        le=100_000,
        description="Recent TPOTs per instance whose median prices a decode token there "
        "(Preble keeps 200 per GPU).",
        json_schema_extra=paper("Preble"),
    )
    eviction_weight: float = Field(
        1.0,
        ge=0,
        le=100,
        description="Scale of the eviction term (recompute cost of the cached tokens a "
        "request would evict × the share of recent requests that used them); 0 disables it.",
        json_schema_extra=paper("Preble"),
    )
    pd_ratio_threshold: float = Field(
        0.8,
        gt=0,
        le=1.0,
        description="Prefill/decode balancing: when exploring, if some instance's decode "
        "share of its load exceeds this, send the request to the instance with the largest "
        "share. 1 disables the rule.",
        json_schema_extra=design(),
    )
    min_cost_floor_tokens: float = Field(
        2048.0,
        ge=0,
        le=1e9,
        description="Floor of the smallest load in the rebalance test, in tokens, "
        "so a nearly idle cluster does not bounce requests on noise.",
        json_schema_extra=design(),
    )
    replicate_ttft_factor: float = Field(
        2.0,
        gt=1.0,
        le=100,
        description="Replicate a hot prefix when its mean TTFT over the window reaches this "
        "× its baseline (the best recent sub-window mean).",
        json_schema_extra=paper("Preble"),
    )
    min_samples: int = Field(
        8,
        ge=1,
        le=100_000,
        description="TTFTs a prefix needs in a sub-window for it to set the baseline, and in "
        "the current window before it may be replicated.",
        json_schema_extra=design(),
    )
    baseline_windows: int = Field(
        8,
        ge=1,
        le=1000,
        description="Past sub-windows (each window_s long) whose best mean TTFT is a "
        "prefix's baseline.",
        json_schema_extra=design(),
    )
    prefix_key_blocks: int = Field(
        32,
        ge=1,
        le=1_000_000,
        description="Blocks of the longest match (from its start) that name a prefix for "
        "TTFT tracking and replication.",
        json_schema_extra=design(),
    )


@dataclass(slots=True)
class _PrefixTTFT:
    """TTFTs of one prefix: a sliding window and best-of-recent-sub-windows baseline."""

    recent: deque[tuple[float, float]] = field(default_factory=deque)
    past: deque[float] = field(default_factory=deque)  # means of completed sub-windows
    bucket: int | None = None
    bucket_sum: float = 0.0
    bucket_n: int = 0

    def add(self, now: float, ttft: float, p: PrebleParams) -> None:
        self.recent.append((now, ttft))
        index = floor(now / p.window_s)
        if index != self.bucket:
            self._close_bucket(p)
            self.bucket, self.bucket_sum, self.bucket_n = index, 0.0, 0
        self.bucket_sum += ttft
        self.bucket_n += 1

    def _close_bucket(self, p: PrebleParams) -> None:
        if self.bucket_n >= p.min_samples:
            self.past.append(self.bucket_sum / self.bucket_n)
            while len(self.past) > p.baseline_windows:
                self.past.popleft()

    def degraded(self, now: float, p: PrebleParams) -> bool:
        while self.recent and self.recent[0][0] <= now - p.window_s:
            self.recent.popleft()
        if not self.past or len(self.recent) < p.min_samples:
            return False
        mean = sum(t for _, t in self.recent) / len(self.recent)
        return mean >= p.replicate_ttft_factor * min(self.past)


class PreblePolicy(RoutingPolicy):
    kind = "preble"
    description = (
        "Preble: exploit the longest prefix or explore by load (windowed prefill, in-flight "
        "decode, eviction); prefill/decode balancing, rebalance, hot-prefix replication."
    )
    Params = PrebleParams
    params: PrebleParams

    def __init__(self, params: PolicyParams | None = None, seed: int = 0) -> None:
        super().__init__(params, seed)
        # (time, slot, uncached prompt tokens, hit tokens on that slot)
        self._window: deque[tuple[float, int, float, float]] = deque()
        self._prefill = np.zeros(0)  # per slot: windowed uncached prompt tokens
        self._hits = np.zeros(0)  # per slot: windowed hit tokens (cache reuse)
        self._output_sum = 0.0
        self._output_n = 0
        self._first_token_at: OrderedDict[str, float] = OrderedDict()  # request id → time
        self._tpots: dict[str, deque[float]] = {}  # instance id → its recent TPOTs
        self._tpot_median: dict[str, float] = {}  # instance id → their median
        # (prefix, instance id) → its TTFTs, least recently fed first
        self._prefix_ttft: OrderedDict[tuple[int, str], _PrefixTTFT] = OrderedDict()
        self._request_prefix: OrderedDict[str, int] = OrderedDict()

    @property
    def decode_cost(self) -> float:
        """One request's decode phase in prefill-token equivalents on an instance with no
        measured TPOT: mean output × the prior token price (or the prior cost before any
        finish)."""
        if self._output_n == 0:
            return self.params.decode_cost_tokens
        return self._output_sum / self._output_n * self.params.decode_token_weight

    def _decode_costs(self, view: ClusterView, allowed: np.ndarray) -> np.ndarray:
        """Per slot, one request's decode phase in prefill-token equivalents: mean output ×
        the slot's median recent TPOT × the cluster's prefill throughput, as Preble prices
        decode (output length × the GPU's median TPOT); ``decode_cost`` where no TPOT has
        been measured yet."""
        costs = np.full(view.size, self.decode_cost)
        if self._output_n == 0 or not self._tpot_median:
            return costs
        mean_output = self._output_sum / self._output_n
        prefill_tps = float(np.median(view.prefill_tps[allowed]))
        for slot, instance_id in enumerate(view.ids):
            tpot = self._tpot_median.get(instance_id)
            if tpot is not None:
                costs[slot] = mean_output * tpot * prefill_tps
        return costs

    def decide(self, request: RequestFeatures, view: ClusterView, now: float) -> Decision:
        allowed = self.eligible_mask(view)
        self._expire(now, view.size)
        cached = view.cached_tokens(request)
        new_tokens = request.prompt_tokens - cached
        decode = view.in_flight * self._decode_costs(view, allowed)
        history = self._prefill + decode
        cost = history + self._eviction_cost(request, view) + new_tokens
        matched = int(cached[allowed].max())
        prefix: int | None
        if matched > request.prompt_tokens - matched:
            slot, reason, prefix = self._exploit(request, view, allowed, cost, matched, now)
        else:
            slot, reason, prefix = self._explore(view, allowed, cost, decode, history)
        slot, reason = self._rebalance(view, allowed, history, cost, slot, reason)
        self._record(request, slot, float(new_tokens[slot]), float(cached[slot]), prefix, now)
        return self.decision(view, request, slot, reason, cost, allowed, matched_tokens=matched)

    def observe_first_token(
        self, request: RequestFeatures, instance_id: str, ttft: float, now: float
    ) -> None:
        prefix = self._request_prefix.pop(request.request_id, None)
        if prefix is not None:
            key = (prefix, instance_id)
            stats = self._prefix_ttft.pop(key, None) or _PrefixTTFT()
            _remember(self._prefix_ttft, key, stats)  # now the most recently fed
            stats.add(now, ttft, self.params)
        _remember(self._first_token_at, request.request_id, now)

    def observe_finish(
        self, request: RequestFeatures, instance_id: str, output_tokens: int, now: float
    ) -> None:
        first_token_at = self._first_token_at.pop(request.request_id, None)
        if output_tokens > 0:
            self._output_sum += output_tokens
            self._output_n += 1
        if first_token_at is not None and output_tokens > 1:
            samples = self._tpots.get(instance_id)
            if samples is None:
                samples = self._tpots[instance_id] = deque(maxlen=self.params.tpot_samples)
            samples.append((now - first_token_at) / (output_tokens - 1))
            self._tpot_median[instance_id] = float(np.median(samples))

    def _eviction_cost(self, request: RequestFeatures, view: ClusterView) -> np.ndarray:
        """Per slot, tokens r would evict × the mean window share of a cached token there."""
        weight = self.params.eviction_weight
        if weight == 0 or not self._window:
            return np.zeros(view.size)
        held = view.held_blocks
        missing = len(request.block_hashes) - view.cached_blocks(request)
        evicted = np.maximum(held + missing - view.capacity_blocks, 0) * view.block_size
        held_tokens = np.maximum(held * view.block_size, 1)
        share = np.minimum(self._hits / (held_tokens * len(self._window)), 1.0)
        return weight * evicted * share

    def _exploit(
        self,
        request: RequestFeatures,
        view: ClusterView,
        allowed: np.ndarray,
        cost: np.ndarray,
        matched: int,
        now: float,
    ) -> tuple[int, str, int]:
        holders = allowed & (view.cached_tokens(request) == matched)
        depth = min(int(view.cached_blocks(request)[holders].max()), self.params.prefix_key_blocks)
        prefix = request.block_hashes[depth - 1]
        slot = self.pick_min((cost, view.pending_prefill), holders)
        stats = self._prefix_ttft.get((prefix, view.ids[slot]))
        others = allowed & ~holders
        if stats is not None and others.any() and stats.degraded(now, self.params):
            stats.recent.clear()
            return self.pick_min((cost, view.pending_prefill), others), "replicate", prefix
        return slot, "exploit", prefix

    def _explore(
        self,
        view: ClusterView,
        allowed: np.ndarray,
        cost: np.ndarray,
        decode: np.ndarray,
        history: np.ndarray,
    ) -> tuple[int, str, None]:
        ratio = np.divide(decode, history, out=np.zeros(view.size), where=history > 0)
        if float(ratio[allowed].max()) > self.params.pd_ratio_threshold:
            return self.pick_min((-ratio, cost, view.pending_prefill), allowed), "pd_balance", None
        return self.pick_min((cost, view.pending_prefill), allowed), "explore", None

    def _rebalance(
        self,
        view: ClusterView,
        allowed: np.ndarray,
        history: np.ndarray,
        cost: np.ndarray,
        slot: int,
        reason: str,
    ) -> tuple[int, str]:
        floor_cost = max(float(history[allowed].min()), self.params.min_cost_floor_tokens)
        if history[slot] < self.params.th_bal * floor_cost:
            return slot, reason
        return self.pick_min((history, cost, view.pending_prefill), allowed), "rebalance"

    def _record(
        self,
        request: RequestFeatures,
        slot: int,
        new_tokens: float,
        hit_tokens: float,
        prefix: int | None,
        now: float,
    ) -> None:
        self._window.append((now, slot, new_tokens, hit_tokens))
        self._prefill[slot] += new_tokens
        self._hits[slot] += hit_tokens
        if prefix is not None:
            _remember(self._request_prefix, request.request_id, prefix)

    def _expire(self, now: float, size: int) -> None:
        grow = size - len(self._prefill)
        if grow > 0:
            self._prefill, self._hits = (
                np.concatenate([array, np.zeros(grow)]) for array in (self._prefill, self._hits)
            )
        horizon = now - self.params.window_s
        while self._window and self._window[0][0] <= horizon:
            _, slot, new_tokens, hit_tokens = self._window.popleft()
            self._prefill[slot] -= new_tokens
            self._hits[slot] -= hit_tokens
        if not self._window:  # drop float residue of the subtractions
            self._prefill[:] = self._hits[:] = 0.0


def _remember(store: OrderedDict[_K, _V], key: _K, value: _V) -> None:
    """Keep ``value`` for ``key``, forgetting the oldest entry past the bound (a request
    whose feedback never comes, or a prefix long gone, must not leak)."""
    store[key] = value
    if len(store) > _MAX_TRACKED_REQUESTS:
        store.popitem(last=False)
