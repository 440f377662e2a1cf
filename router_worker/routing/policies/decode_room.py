"""``decode_room``: the decode stage of a disaggregated cluster — smallest batch among the
instances with KV room for the request.

LMetric's discussion of disaggregated serving proposes routing the decode half by batch
and load, with no prefill indicator: a decode instance computes one token of the prompt
and then takes the whole prompt's KV from the prefill instance. Its cost is its running
batch (every step reads every running request's context) and its room: the prompt's
blocks must fit, or the read waits (or the engine preempts).

Rule: among eligible instances whose free KV (``capacity × (1 − KV usage − headroom)``,
usage as last scraped, 0 before any scrape) holds the request's prompt blocks, the
smallest batch (the view's ``batch_size``); if none has the room, every eligible instance.
Ties: more free KV, then fewer in-flight requests, then seeded random.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from router_worker.routing.features import RequestFeatures
from router_worker.routing.indicators import ClusterView
from router_worker.routing.policies.base import Decision, PolicyParams, RoutingPolicy
from router_worker.routing.provenance import design


class DecodeRoomParams(PolicyParams):
    kv_headroom: float = Field(
        0.05,
        ge=0.0,
        lt=1.0,
        description="share of each instance's KV cache kept free when judging room "
        "(raise it if decode instances preempt)",
        json_schema_extra=design(),
    )


class DecodeRoomPolicy(RoutingPolicy):
    kind = "decode_room"
    description = "Decode stage: smallest batch among instances with KV room for the prompt."
    Params = DecodeRoomParams
    params: DecodeRoomParams

    def decide(self, request: RequestFeatures, view: ClusterView, now: float) -> Decision:
        allowed = self.eligible_mask(view)
        free = view.capacity_blocks * (1.0 - view.kv_usage_or_zero - self.params.kv_headroom)
        need = -(-request.prompt_tokens // view.block_size)
        roomy = allowed & (free >= need)
        if roomy.any():
            allowed = roomy
        scores = np.asarray(view.batch_size, dtype=float)
        slot = self.pick_min((scores, -free, view.in_flight), allowed)
        return self.decision(view, request, slot, "score", scores, allowed)
