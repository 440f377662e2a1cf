"""``least_load``: fewest in-flight requests; KV-blind.

Score = in-flight requests (router-local). Ties: lower pending prefill tokens,
then seeded random.
"""

from __future__ import annotations

from router_worker.routing.features import RequestFeatures
from router_worker.routing.indicators import ClusterView
from router_worker.routing.policies.base import Decision, PolicyParams, RoutingPolicy


class LeastLoadParams(PolicyParams):
    """No parameters."""


class LeastLoadPolicy(RoutingPolicy):
    kind = "least_load"
    description = "Fewest in-flight requests; ignores the KV cache (baseline)."
    Params = LeastLoadParams

    def decide(self, request: RequestFeatures, view: ClusterView, now: float) -> Decision:
        allowed = self.eligible_mask(view)
        scores = view.in_flight
        slot = self.pick_min((scores, view.pending_prefill), allowed)
        return self.decision(view, request, slot, "score", scores, allowed)
