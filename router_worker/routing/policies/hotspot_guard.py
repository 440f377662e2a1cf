"""LMetric's hotspot detector as a guard any cache-affine policy can put over its choice
(docs/algorithms.md, "The hotspot guard").

A long prefix shared by a burst of requests makes every rule that follows cache hits send
them to the few instances holding it: each decision is right for its request (the hit
saves a long prefill, or waiting for the holder's in-flight prefill beats starting it
again elsewhere), and the class piles up behind those instances while the rest of the
fleet idles. A rule that spreads the class instead pays the prefix once per instance, in
parallel, early, and never again. The detector (:mod:`router_worker.routing.hotspot`)
tells the two apart from the traffic alone; while it holds a class confirmed hot, the
policy places the class's requests among the healthy instances *outside* M by its own
rule, which then cannot prefer the holders. LMetric runs it as its paper says; SMetric
and predicted_ttft run the same detector with the same settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import Field

from router_worker.routing.features import RequestFeatures
from router_worker.routing.hotspot import HotspotDetector, HotspotParams, HotspotTransition
from router_worker.routing.indicators import ClusterView


def hotspot_field() -> Any:
    """The ``hotspot`` parameter of a policy that runs the guard (declared last, so the
    detector's settings close the policy's form)."""
    return Field(default_factory=HotspotParams, description="hotspot detector settings")


@dataclass(frozen=True, slots=True)
class HotspotVerdict:
    """What the detector made of one decision: ``outside`` is set while the request's
    class is confirmed hot (the eligible instances not holding its prefix)."""

    outside: np.ndarray | None
    class_id: str | None
    events: list[HotspotTransition]

    @property
    def fallback(self) -> bool:
        return self.outside is not None

    def details(self) -> dict[str, object]:
        """The decision details a fallback carries (the events ride on every decision)."""
        return {"hot_class": self.class_id} if self.fallback else {}


class HotspotGuard:
    """Runs the detector on each decision of one policy instance (pure: time is passed in)."""

    def __init__(self, params: HotspotParams) -> None:
        self.params = params
        self.detector = HotspotDetector(params)

    def check(
        self,
        request: RequestFeatures,
        view: ClusterView,
        eligible: np.ndarray,
        choice: int,
        now: float,
    ) -> HotspotVerdict:
        """Record the policy's own ``choice`` for ``request``; say whether to fall back."""
        if not self.params.enabled:
            return HotspotVerdict(None, None, [])
        prefix_class = self.detector.classify(request, view.cached_blocks(request), eligible)
        fallback, events = self.detector.update(
            request, prefix_class, choice, eligible, view.ids, now
        )
        if not fallback or prefix_class is None:
            return HotspotVerdict(None, None, events)
        outside = eligible & ~prefix_class.members
        return HotspotVerdict(outside, f"{prefix_class.class_id:016x}", events)
