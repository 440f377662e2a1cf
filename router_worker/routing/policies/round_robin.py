"""``round_robin``: cyclic over healthy instances, KV- and load-blind.

Keeps a cursor on slot numbers: the next healthy slot after the last one
chosen, wrapping. Score = distance from the cursor (so the table shows the
order). The very first pick starts at a seeded random slot so that several
routers started together do not all begin on the same instance.
"""

from __future__ import annotations

import numpy as np

from router_worker.routing.features import RequestFeatures
from router_worker.routing.indicators import ClusterView
from router_worker.routing.policies.base import Decision, PolicyParams, RoutingPolicy


class RoundRobinParams(PolicyParams):
    """No parameters."""


class RoundRobinPolicy(RoutingPolicy):
    kind = "round_robin"
    description = "Cyclic over healthy instances; ignores load and KV cache (baseline)."
    Params = RoundRobinParams

    def __init__(self, params: PolicyParams | None = None, seed: int = 0) -> None:
        super().__init__(params, seed)
        self._last: int | None = None

    def decide(self, request: RequestFeatures, view: ClusterView, now: float) -> Decision:
        allowed = self.eligible_mask(view)
        if self._last is None:
            self._last = self.rng.randrange(view.size) - 1
        distance = (np.arange(view.size) - (self._last + 1)) % view.size
        slot = int(np.flatnonzero(allowed)[np.argmin(distance[allowed])])
        self._last = slot
        return self.decision(view, request, slot, "cyclic", distance.astype(float), allowed)
