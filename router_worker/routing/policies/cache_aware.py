"""``cache_aware``: SGLang router's cache-aware rule.

Load = in-flight requests (SGLang counts running requests per worker).

1. Imbalance: if ``max load − min load > balance_abs_threshold`` and
   ``max load > balance_rel_threshold × min load`` (over healthy instances)
   → least-loaded instance (reason ``imbalance_fallback``).
2. Else if the longest local prefix match covers more than ``cache_threshold``
   of the prompt → the instance with that match (reason ``cache_hit``; ties by
   lower load, then random).
3. Else → least-loaded instance (reason ``low_match``).
   (SGLang sends misses to the worker with the smallest radix tree; why this one
   does not: docs/algorithms.md, "cache_aware".)

Defaults are SGLang's current ones (``cache_threshold=0.3``,
``balance_abs_threshold=64``, ``balance_rel_threshold=1.5``; older releases
used 0.5 / 32 / 1.0001). Keeping them makes our baseline the policy people
actually run. On small clusters with a handful of requests per instance the
absolute threshold of 64 rarely fires; lower it for those.

Score reported per instance: its match ratio (negated, so lower is better)
on the cache path, its load on the load paths.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from router_worker.routing.features import RequestFeatures
from router_worker.routing.indicators import ClusterView
from router_worker.routing.policies.base import Decision, PolicyParams, RoutingPolicy
from router_worker.routing.provenance import paper


class CacheAwareParams(PolicyParams):
    cache_threshold: float = Field(
        0.3,
        ge=0.0,
        le=1.0,
        description="min matched fraction of the prompt to follow the cache",
        json_schema_extra=paper("SGLang router"),
    )
    balance_abs_threshold: float = Field(
        64,
        ge=0,
        description="load imbalance when max − min in-flight requests exceeds this "
        "(and the relative test below holds): then route to the least-loaded instance",
        json_schema_extra=paper("SGLang router"),
    )
    balance_rel_threshold: float = Field(
        1.5,
        ge=1.0,
        description="load imbalance also needs max in-flight requests above "
        "this × min (with the absolute test above)",
        json_schema_extra=paper("SGLang router"),
    )


class CacheAwarePolicy(RoutingPolicy):
    kind = "cache_aware"
    description = "SGLang router: longest prefix match unless load is imbalanced or match is low."
    Params = CacheAwareParams
    params: CacheAwareParams

    def decide(self, request: RequestFeatures, view: ClusterView, now: float) -> Decision:
        allowed = self.eligible_mask(view)
        load = view.in_flight
        if self._imbalanced(load[allowed]):
            slot = self.pick_min((load, view.pending_prefill), allowed)
            return self.decision(view, request, slot, "imbalance_fallback", load, allowed)
        match_ratio = view.cached_tokens(request) / max(request.prompt_tokens, 1)
        best_ratio = float(match_ratio[allowed].max())
        if best_ratio > self.params.cache_threshold:
            slot = self.pick_min((-match_ratio, load), allowed)
            return self.decision(
                view, request, slot, "cache_hit", -match_ratio, allowed, match_ratio=best_ratio
            )
        slot = self.pick_min((load, view.pending_prefill), allowed)
        return self.decision(
            view, request, slot, "low_match", load, allowed, match_ratio=best_ratio
        )

    def _imbalanced(self, load: np.ndarray) -> bool:
        high, low = float(load.max()), float(load.min())
        return (
            high - low > self.params.balance_abs_threshold
            and high > self.params.balance_rel_threshold * low
        )
