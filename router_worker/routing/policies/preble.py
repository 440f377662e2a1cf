"""``preble``: Preble's E2 global scheduling rule (docs/algorithms.md, "preble").

Per request, with ``matched`` = the longest local prefix hit over healthy
instances and ``new = prompt − matched``:

* **exploit** when ``matched > new``: among the instances holding that longest
  match, the one with the least load cost;
* **explore** otherwise: the least load cost over all healthy instances, unless
  the prefill/decode balancing rule below applies (``pd_balance``).

Load cost of instance i (in prefill-token equivalents) =
``window_i + evict_i(r) + new_i(r)``:

* ``window_i``, the history term: over the requests assigned to i in the last
  ``window_s`` seconds (Preble's H), Σ their uncached prompt tokens plus their
  count × ``decode_cost``. ``decode_cost`` prices one request's decode phase
  from the historical mean response length (as Preble does): the running mean
  of the output tokens reported through ``observe_finish`` ×
  ``decode_token_weight`` (GPU time of one decode token over that of one
  prefill token; Preble fits both with per-model/GPU
  regressions, which a router cannot run, so the ratio is a parameter). Until a
  finish has been observed, ``decode_cost_tokens`` is the prior. The current
  ``decode_cost`` prices every request in the window (not the value at its
  dispatch), as Preble's load of a GPU uses the current mean.
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
``new ≥ matched``): instance i's decode ratio is its windowed decode load ÷ its
windowed load (count_i × decode_cost ÷ window_i; 0 with an empty window). If
some healthy instance's ratio exceeds ``pd_ratio_threshold``, r goes to the
instance with the largest ratio (ties: lower cost, then pending prefill) —
prefill fills the compute a decode-bound GPU leaves idle (``pd_balance``).

Post-assignment rebalancing: if the chosen instance's windowed cost is at
least ``th_bal`` × the smallest windowed cost (that smallest floored at
``min_cost_floor_tokens`` so a nearly idle cluster does not bounce on noise),
the request goes to the least-cost instance instead (``rebalance``).

Hot-prefix replication: a prefix is keyed by the first ``min(matched blocks,
prefix_key_blocks)`` blocks of the longest match (a shared system prompt or
document, not each conversation's own tail, so requests sharing it pool their
samples). TTFTs fed back through ``observe_first_token`` for requests sent by
exploit (or replicate) are kept per prefix. The baseline adapts: time is cut
into consecutive sub-windows of length H; each sub-window with at least
``min_samples`` TTFTs contributes its mean, and the baseline is the least of
the last ``baseline_windows`` such means (the prefix's best recent level, so a
slow drift moves it and one noisy sub-window does not). When the mean TTFT
over the sliding window H (at least ``min_samples`` TTFTs) reaches
``replicate_ttft_factor`` × baseline, the next request of that prefix goes to
the least-cost instance *not* holding the match (``replicate``), and the
sliding window restarts (another replica needs ``min_samples`` fresh TTFTs
that are still degraded); the baseline history is kept. Nothing fires before
one sub-window of history exists.
Ties everywhere: lower pending prefill, then seeded random.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from math import floor

import numpy as np
from pydantic import Field

from router_worker.routing.features import RequestFeatures
from router_worker.routing.indicators import ClusterView
from router_worker.routing.policies.base import Decision, PolicyParams, RoutingPolicy

_MAX_TRACKED_REQUESTS = 100_000


class PrebleParams(PolicyParams):
    window_s: float = Field(
        180.0,
        gt=0,
        le=86_400,
        description="Preble's history window H in seconds: the load of an instance sums the "
        "requests assigned to it in the last H seconds; also the TTFT window of replication.",
    )
    th_bal: float = Field(
        1.5,
        ge=1.0,
        le=100,
        description="Rebalance: if the chosen instance's windowed load is at least th_bal × "
        "the smallest windowed load, send the request to the least-loaded instance instead.",
    )
    decode_cost_tokens: float = Field(
        128.0,
        ge=0,
        le=1e7,
        description="Prior decode cost of one request, in prefill-token equivalents, used "
        "until the first finished request reports its output length.",
    )
    decode_token_weight: float = Field(
        1.3,
        ge=0,
        le=100,
        description="GPU time of one decode token ÷ that of one prefill token (model- and "
        "GPU-specific). Decode cost of a request = mean output tokens × this. Default: "
        "Qwen2-7B on H20 at decode batches of 32-64 (decode step time per sequence ÷ "
        "prefill time per token: 1.2-1.5 in enginesim's roofline model).",
    )
    eviction_weight: float = Field(
        1.0,
        ge=0,
        le=100,
        description="Scale of the eviction term (recompute cost of the cached tokens a "
        "request would evict × the share of recent requests that used them); 0 disables it.",
    )
    pd_ratio_threshold: float = Field(
        0.8,
        gt=0,
        le=1.0,
        description="Prefill/decode balancing: when exploring, if some instance's decode "
        "share of its windowed load exceeds this, send the request to the instance with the "
        "largest share. 1 disables the rule.",
    )
    min_cost_floor_tokens: float = Field(
        2048.0,
        ge=0,
        le=1e9,
        description="Floor of the smallest windowed load in the rebalance test, in tokens, "
        "so a nearly idle cluster does not bounce requests on noise.",
    )
    replicate_ttft_factor: float = Field(
        2.0,
        gt=1.0,
        le=100,
        description="Replicate a hot prefix when its mean TTFT over the window reaches this "
        "× its baseline (the best recent sub-window mean).",
    )
    min_samples: int = Field(
        8,
        ge=1,
        le=100_000,
        description="TTFTs a prefix needs in a sub-window for it to set the baseline, and in "
        "the current window before it may be replicated.",
    )
    baseline_windows: int = Field(
        8,
        ge=1,
        le=1000,
        description="Past sub-windows (each window_s long) whose best mean TTFT is a "
        "prefix's baseline.",
    )
    prefix_key_blocks: int = Field(
        32,
        ge=1,
        le=1_000_000,
        description="Blocks of the longest match (from its start) that name a prefix for "
        "TTFT tracking and replication.",
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
        "Preble: exploit the longest prefix or explore by windowed load (prefill, decode, "
        "eviction); prefill/decode balancing, rebalance, hot-prefix replication."
    )
    Params = PrebleParams
    params: PrebleParams

    def __init__(self, params: PolicyParams | None = None, seed: int = 0) -> None:
        super().__init__(params, seed)
        # (time, slot, uncached prompt tokens, hit tokens on that slot)
        self._window: deque[tuple[float, int, float, float]] = deque()
        self._prefill = np.zeros(0)  # per slot: windowed uncached prompt tokens
        self._count = np.zeros(0)  # per slot: requests in the window
        self._hits = np.zeros(0)  # per slot: windowed hit tokens (cache reuse)
        self._output_sum = 0.0
        self._output_n = 0
        self._prefix_ttft: dict[int, _PrefixTTFT] = {}
        self._request_prefix: OrderedDict[str, int] = OrderedDict()

    @property
    def decode_cost(self) -> float:
        """One request's decode phase in prefill-token equivalents (mean, or the prior)."""
        if self._output_n == 0:
            return self.params.decode_cost_tokens
        return self._output_sum / self._output_n * self.params.decode_token_weight

    def decide(self, request: RequestFeatures, view: ClusterView, now: float) -> Decision:
        allowed = self.eligible_mask(view)
        self._expire(now, view.size)
        cached = view.cached_tokens(request)
        new_tokens = request.prompt_tokens - cached
        decode = self._count * self.decode_cost
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
            self._prefix_ttft.setdefault(prefix, _PrefixTTFT()).add(now, ttft, self.params)

    def observe_finish(
        self, request: RequestFeatures, instance_id: str, output_tokens: int, now: float
    ) -> None:
        if output_tokens > 0:
            self._output_sum += output_tokens
            self._output_n += 1

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
        stats = self._prefix_ttft.get(prefix)
        others = allowed & ~holders
        if stats is not None and others.any() and stats.degraded(now, self.params):
            stats.recent.clear()
            return self.pick_min((cost, view.pending_prefill), others), "replicate", prefix
        return self.pick_min((cost, view.pending_prefill), holders), "exploit", prefix

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
        self._count[slot] += 1
        self._hits[slot] += hit_tokens
        if prefix is not None:
            self._request_prefix[request.request_id] = prefix
            if len(self._request_prefix) > _MAX_TRACKED_REQUESTS:
                self._request_prefix.popitem(last=False)

    def _expire(self, now: float, size: int) -> None:
        grow = size - len(self._prefill)
        if grow > 0:
            self._prefill, self._count, self._hits = (
                np.concatenate([array, np.zeros(grow)])
                for array in (self._prefill, self._count, self._hits)
            )
        horizon = now - self.params.window_s
        while self._window and self._window[0][0] <= horizon:
            _, slot, new_tokens, hit_tokens = self._window.popleft()
            self._prefill[slot] -= new_tokens
            self._count[slot] -= 1
            self._hits[slot] -= hit_tokens
        if not self._window:  # drop float residue of the subtractions
            self._prefill[:] = self._count[:] = self._hits[:] = 0.0
