"""``lmetric``: minimum of ``P-token_i(r) × BS_i``, plus the hotspot detector.

Score = prefill term × load term (the paper, and where this departs from it:
docs/algorithms.md, "lmetric"):

* prefill term ``p_token`` (default, the paper's): pending prefill tokens on i + r's
  prompt tokens not cached on i. ``miss_ratio`` (the paper's ablation): 1 − r's local
  hit ratio on i, which ignores the queue and the prompt's size.
* load term ``batch_size`` (default, the paper's): BS, the requests in i's running
  batch, prefilling or decoding (vLLM v1 runs chunked prefills in the same batch as the
  decodes; see :mod:`router_worker.routing.indicators`). ``total_tokens`` (the paper's
  ablation): the tokens of that batch, the decoding requests' contexts plus the pending
  prefill (its offset is c × r's prompt tokens).
  ``decode_step``: the time of the decode step r would join, from the fleet's decode
  costs (the decode guard's ``g_i``): ``BS + c`` with c read at each instance's own
  running contexts.
* global KV tier: a prompt's blocks the tier holds load onto any instance instead of
  being prefilled there, so with a tier the prefill term charges them
  ``tier_token_cost`` of a token each (SMetric's estimate does the same). The paper has
  no tier; without one, or with ``tier_token_cost`` null, the term is its P-token.
* ``batch_offset`` c: the load term is ``BS + c``. The paper calls BS "the current
  batch size" and leaves open whether the routed request counts; c = 0 is the paper's
  exact form, c = 1 counts the routed request. With c = 0 an idle instance (BS = 0)
  scores 0 whatever its cache, so at partial load any idle instance beats the one holding
  r's prefix, and the product throws the cache away exactly when there is room to use
  it. A larger c reads the load term as the step time of the batch r joins: a vLLM step
  costs a fixed part (weights, scheduling) plus a part per running request (its KV
  reads, its token), so step time ∝ c + BS with c = fixed cost ÷ per-request cost — on
  an H20 serving a 7B model tens of requests' worth (3.8 ms of weights against ~0.1 ms
  of KV per 8k-token context). BS then matters once it is large against that fixed
  part, as it does for the engine, and the product still has no workload weight. The
  default, c = 1, is the value that measured best across the evaluation matrix on
  goodput (bench/replay/; c = 0 and c ∈ {4 … 64} are rows of their own with
  ``--ablations``): larger c kept more requests on their prefix's holders, which won
  TTFT at partial load but lost goodput where batches grow (the Azure code cells).

Decode guard (:mod:`router_worker.routing.policies.decode_guard`): the product chooses
only among instances whose decode step with r stays within ``decode_slack`` of the fastest
one's, so a prefix hit cannot pile decode onto its holders; null = the paper's rule.

KV pressure (:mod:`router_worker.routing.kv_pressure`, ``kv_pressure``, on by default):
the guard counts every request dispatched to an instance from its dispatch (queued ones
too), and the product chooses only among instances whose KV holds r with its expected
output on top of what they have taken on while one does (else the least short); off =
neither.

Ties: lower prefill term, then lower BS, then seeded random — so among equal products
the one with the best cache hit and shortest prefill queue wins instead of a blind tie.

Hotspot fallback (see :mod:`router_worker.routing.hotspot`): while a class is confirmed
hot, its requests are routed over the healthy instances *outside* M by the cache-blind
product ``(pending prefill + prompt tokens) × load term`` (same tie-breaks), reason
``hotspot_fallback``. Otherwise reason ``score``. Every detector transition rides on the
decision as a ``HotspotTransition``.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from router_worker.routing.features import RequestFeatures
from router_worker.routing.hotspot import HotspotParams
from router_worker.routing.indicators import ClusterView
from router_worker.routing.kv_pressure import kv_room
from router_worker.routing.policies.base import Decision, PolicyParams
from router_worker.routing.policies.decode_guard import (
    DecodeGuardedPolicy,
    DecodeGuardParams,
    decode_headroom,
    decode_load,
)
from router_worker.routing.policies.hotspot_guard import HotspotGuard, hotspot_field
from router_worker.routing.provenance import matrix, paper


class LMetricParams(DecodeGuardParams):
    batch_offset: float = Field(
        1.0,
        ge=0.0,
        description="c in the load term BS + c: 0 = the paper's exact BS (an idle instance "
        "scores 0 whatever its cache), 1 = count the routed request, larger = the engine's "
        "fixed step cost in running requests' worth",
        json_schema_extra=matrix(),
    )
    prefill_term: Literal["p_token", "miss_ratio"] = Field(
        "p_token",
        description="p_token: pending prefill + the request's uncached tokens (the paper's); "
        "miss_ratio: 1 − local hit ratio (the paper's ablation)",
        json_schema_extra=paper("LMetric"),
    )
    load_term: Literal["batch_size", "total_tokens", "decode_step"] = Field(
        "batch_size",
        description="batch_size: requests in the running batch, plus c (the paper's); "
        "total_tokens: context tokens of the batch (the paper's ablation); decode_step: "
        "the time of the decode step the request joins, from the fleet's decode costs "
        "(grows with the batch and its contexts; c unused)",
        json_schema_extra=paper("LMetric"),
    )
    tier_token_cost: float | None = Field(
        0.1,
        ge=0.0,
        le=1.0,
        description="with a global KV tier, what a token loaded from it costs in P-token "
        "relative to a recomputed one (the engine loads it instead of prefilling it); "
        "null = ignore the tier, as the paper does",
        json_schema_extra=matrix(),
    )
    hotspot: HotspotParams = hotspot_field()


class LMetricPolicy(DecodeGuardedPolicy):
    kind = "lmetric"
    description = "Minimum P-token × batch size, with KV hotspot detection and fallback."
    Params = LMetricParams
    params: LMetricParams

    def __init__(self, params: PolicyParams | None = None, seed: int = 0) -> None:
        super().__init__(params, seed)
        self.guard = HotspotGuard(self.params.hotspot)

    def decide(self, request: RequestFeatures, view: ClusterView, now: float) -> Decision:
        eligible = self.eligible_mask(view)
        # the decode guard narrows where the score may send r; the detector still sees
        # every healthy instance (M is who holds the prefix, whatever their batches)
        candidates = decode_headroom(request, view, eligible, self.params)
        if self.params.kv_pressure:
            candidates = kv_room(request, view, candidates, self.outputs)
        batch = view.batch_size  # computed per call by the view: read it once
        prefill = self._prefill_term(request, view)
        load = self._load_term(request, view, batch)
        scores = prefill * load
        slot = self.pick_min((scores, prefill, batch), candidates)
        verdict = self.guard.check(request, view, eligible, slot, now)
        if verdict.outside is None:
            return self.decision(
                view, request, slot, "score", scores, candidates, events=verdict.events
            )
        outside = verdict.outside
        allowed = outside & candidates if (outside & candidates).any() else outside
        blind_p = view.pending_prefill + request.prompt_tokens
        scores = blind_p * load
        slot = self.pick_min((scores, blind_p, batch), allowed)
        return self.decision(
            view,
            request,
            slot,
            "hotspot_fallback",
            scores,
            allowed,
            events=verdict.events,
            **verdict.details(),
        )

    def _prefill_term(self, request: RequestFeatures, view: ClusterView) -> np.ndarray:
        if self.params.prefill_term == "miss_ratio":
            return view.new_tokens(request) / max(request.prompt_tokens, 1)
        return view.p_tokens(request, tier_token_cost=self.params.tier_token_cost)

    def _load_term(
        self, request: RequestFeatures, view: ClusterView, batch: np.ndarray
    ) -> np.ndarray:
        offset = self.params.batch_offset
        if self.params.load_term == "decode_step":
            return decode_load(request, view, self.params)
        if self.params.load_term == "total_tokens":
            batch_tokens = view.decode_context_tokens + view.pending_prefill
            return batch_tokens + offset * request.prompt_tokens
        return batch + offset
