"""``preble``: Preble's E2 global scheduling rule (seed 003 §1.2).

Per request, with ``matched`` = the longest local prefix hit over healthy
instances and ``new = prompt − matched``:

* **exploit** when ``matched > new``: among the instances holding that longest
  match, the one with the least load cost;
* **explore** otherwise: the least load cost over all healthy instances.

Load cost of instance i = windowed cost + this request's prefill on i, where
the windowed cost sums, over requests assigned to i in the last ``window_s``
seconds (Preble's H), ``uncached prompt tokens + decode_cost_tokens`` (a
request's decode phase priced in prefill-token equivalents; Preble fits both
with per-GPU regressions, which we do not have). Preble's eviction-cost term
is not modelled.

Post-assignment rebalancing: if the chosen instance's windowed cost is at
least ``th_bal`` × the smallest windowed cost (that smallest floored at
``min_cost_floor_tokens`` so a nearly idle cluster does not bounce on noise),
the request goes to the least-cost instance instead (``rebalance``).

Hot-prefix replication: TTFTs fed back through ``observe_first_token`` are
kept per exploited prefix; the first ``baseline_samples`` set its baseline
mean; when the mean TTFT over the window reaches ``replicate_ttft_factor`` ×
baseline, the next request of that prefix is sent to the least-cost instance
*not* holding it (``replicate``) and the prefix's statistics restart.
Ties everywhere: lower pending prefill, then seeded random.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

import numpy as np
from pydantic import Field

from router_worker.routing.features import RequestFeatures
from router_worker.routing.indicators import ClusterView
from router_worker.routing.policies.base import Decision, Policy, PolicyParams

_MAX_TRACKED_REQUESTS = 100_000


class PrebleParams(PolicyParams):
    window_s: float = Field(180.0, gt=0, description="load history window H, seconds")
    th_bal: float = Field(1.5, ge=1.0, description="rebalance when chosen cost ≥ th_bal × min")
    decode_cost_tokens: float = Field(
        128.0, ge=0, description="decode phase of one request, in prefill-token equivalents"
    )
    min_cost_floor_tokens: float = Field(
        2048.0, ge=0, description="floor of the minimum cost in the rebalance test"
    )
    replicate_ttft_factor: float = Field(
        2.0, gt=1.0, description="replicate a prefix when its windowed TTFT reaches this × baseline"
    )
    baseline_samples: int = Field(8, ge=1, description="TTFTs that set a prefix's baseline")


@dataclass(slots=True)
class _PrefixTTFT:
    baseline: float | None = None
    recent: deque[tuple[float, float]] = field(default_factory=deque)

    def add(self, now: float, ttft: float, samples: int) -> None:
        self.recent.append((now, ttft))
        if self.baseline is None and len(self.recent) >= samples:
            self.baseline = sum(t for _, t in self.recent) / len(self.recent)

    def doubled(self, now: float, window_s: float, factor: float) -> bool:
        while self.recent and self.recent[0][0] <= now - window_s:
            self.recent.popleft()
        if self.baseline is None or not self.recent:
            return False
        mean = sum(t for _, t in self.recent) / len(self.recent)
        return mean >= factor * self.baseline


class PreblePolicy(Policy):
    kind = "preble"
    description = "Preble: exploit the longest prefix or explore by windowed load; rebalance."
    Params = PrebleParams
    params: PrebleParams

    def __init__(self, params: PolicyParams | None = None, seed: int = 0) -> None:
        super().__init__(params, seed)
        self._window: deque[tuple[float, int, float]] = deque()
        self._window_cost = np.zeros(0)
        self._prefix_ttft: dict[int, _PrefixTTFT] = {}
        self._request_prefix: OrderedDict[str, int] = OrderedDict()

    def decide(self, request: RequestFeatures, view: ClusterView, now: float) -> Decision:
        allowed = self.eligible_mask(view)
        self._expire(now, view.size)
        cached = view.cached_tokens(request)
        new_tokens = request.prompt_tokens - cached
        cost = self._window_cost + new_tokens
        matched = int(cached[allowed].max())
        slot, reason, prefix = self._exploit_or_explore(request, view, allowed, cost, matched, now)
        slot, reason = self._rebalance(view, allowed, cost, slot, reason)
        self._record(request, slot, float(new_tokens[slot]), prefix, now)
        return self.decision(view, request, slot, reason, cost, allowed, matched_tokens=matched)

    def observe_first_token(
        self, request: RequestFeatures, instance_id: str, ttft: float, now: float
    ) -> None:
        prefix = self._request_prefix.pop(request.request_id, None)
        if prefix is not None:
            stats = self._prefix_ttft.setdefault(prefix, _PrefixTTFT())
            stats.add(now, ttft, self.params.baseline_samples)

    def _exploit_or_explore(
        self,
        request: RequestFeatures,
        view: ClusterView,
        allowed: np.ndarray,
        cost: np.ndarray,
        matched: int,
        now: float,
    ) -> tuple[int, str, int | None]:
        if matched <= request.prompt_tokens - matched:
            return self.pick_min((cost, view.pending_prefill), allowed), "explore", None
        holders = allowed & (view.cached_tokens(request) == matched)
        prefix = request.block_hashes[view.cached_blocks(request)[holders].max() - 1]
        stats = self._prefix_ttft.get(prefix)
        others = allowed & ~holders
        p = self.params
        if stats is not None and others.any() and stats.doubled(
            now, p.window_s, p.replicate_ttft_factor
        ):
            del self._prefix_ttft[prefix]
            return self.pick_min((cost, view.pending_prefill), others), "replicate", prefix
        return self.pick_min((cost, view.pending_prefill), holders), "exploit", prefix

    def _rebalance(
        self, view: ClusterView, allowed: np.ndarray, cost: np.ndarray, slot: int, reason: str
    ) -> tuple[int, str]:
        history = self._window_cost
        floor = max(float(history[allowed].min()), self.params.min_cost_floor_tokens)
        if history[slot] < self.params.th_bal * floor:
            return slot, reason
        return self.pick_min((history, cost, view.pending_prefill), allowed), "rebalance"

    def _record(
        self, request: RequestFeatures, slot: int, new_tokens: float, prefix: int | None, now: float
    ) -> None:
        charge = new_tokens + self.params.decode_cost_tokens
        self._window.append((now, slot, charge))
        self._window_cost[slot] += charge
        if prefix is not None:
            self._request_prefix[request.request_id] = prefix
            if len(self._request_prefix) > _MAX_TRACKED_REQUESTS:
                self._request_prefix.popitem(last=False)

    def _expire(self, now: float, size: int) -> None:
        if len(self._window_cost) < size:
            self._window_cost = np.concatenate(
                [self._window_cost, np.zeros(size - len(self._window_cost))]
            )
        horizon = now - self.params.window_s
        while self._window and self._window[0][0] <= horizon:
            _, slot, charge = self._window.popleft()
            self._window_cost[slot] -= charge
