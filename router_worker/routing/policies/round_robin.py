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
        size = view.size
        if self._last is None:
            self._last = self.rng.randrange(size) - 1
        # Plain Python: numpy calls cost more than a walk over a cluster's slots.
        start = self._last + 1
        healthy = allowed.tolist()
        slot = next(s % size for s in range(start, start + size) if healthy[s % size])
        self._last = slot
        distance = np.array([(s - start) % size for s in range(size)], dtype=float)
        return self.decision(view, request, slot, "cyclic", distance, allowed)
