"""``lmetric``: minimum of ``P-token_i(r) × BS_i``, plus the hotspot detector.

Score = P-token × BS (DESIGN.md §3). BS is the view's ``batch_size``: the
requests in the engine's running batch, prefilling or decoding (vLLM v1 runs a
request's chunked prefill in the same batch as the decodes), not only those
past their first token — so an instance busy with a long prefill is not "idle"
with score 0 (see :mod:`router_worker.routing.indicators`). Ties: lower
P-token, then lower BS, then seeded random — so among idle instances (BS = 0,
score 0: nothing running; requests the engine reports queued do not count) the
one with the best cache hit and shortest prefill queue wins instead of a blind
tie.

Hotspot fallback (see :mod:`router_worker.routing.hotspot`): while a class is
confirmed hot, its requests are routed over the healthy instances *outside* M
by the cache-blind product ``(pending prefill + prompt tokens) × BS`` (same
tie-breaks), reason ``hotspot_fallback``. Otherwise reason ``score``. Every
detector transition rides on the decision as a ``HotspotEvent``.
"""

from __future__ import annotations

from pydantic import Field

from router_worker.routing.features import RequestFeatures
from router_worker.routing.hotspot import HotspotDetector, HotspotParams
from router_worker.routing.indicators import ClusterView
from router_worker.routing.policies.base import Decision, Policy, PolicyParams


class LMetricParams(PolicyParams):
    hotspot: HotspotParams = Field(
        default_factory=HotspotParams, description="hotspot detector settings"
    )


class LMetricPolicy(Policy):
    kind = "lmetric"
    description = "Minimum P-token × batch size, with KV hotspot detection and fallback."
    Params = LMetricParams
    params: LMetricParams

    def __init__(self, params: PolicyParams | None = None, seed: int = 0) -> None:
        super().__init__(params, seed)
        self.detector = HotspotDetector(self.params.hotspot)

    def decide(self, request: RequestFeatures, view: ClusterView, now: float) -> Decision:
        allowed = self.eligible_mask(view)
        p_tokens = view.p_tokens(request)
        batch = view.batch_size
        scores = p_tokens * batch
        slot = self.pick_min((scores, p_tokens, batch), allowed)
        if not self.params.hotspot.enabled:
            return self.decision(view, request, slot, "score", scores, allowed)
        cached = view.cached_blocks(request)
        prefix_class = self.detector.classify(request, cached, allowed)
        fallback, events = self.detector.update(
            request, prefix_class, slot, allowed, view.ids, now
        )
        if fallback and prefix_class is not None:
            allowed = allowed & ~prefix_class.members
            blind_p = view.pending_prefill + request.prompt_tokens
            scores = blind_p * batch
            slot = self.pick_min((scores, blind_p, batch), allowed)
            return self.decision(view, request, slot, "hotspot_fallback", scores, allowed,
                                 events=events, hot_class=f"{prefix_class.class_id:016x}")
        return self.decision(view, request, slot, "score", scores, allowed, events=events)
