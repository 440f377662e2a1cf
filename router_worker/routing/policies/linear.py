"""``linear``: weighted sum of a prefill indicator and a decode indicator.

Two variants:

* ``weighted_sum`` (BAILIAN-style): ``w · P-token/max P-token + (1 − w) · BS/max BS``
  (BS = the view's ``batch_size``: requests in the engine's running batch,
  prefilling or decoding),
  each indicator normalised by its maximum over the healthy instances (1 when
  that maximum is 0), so both terms lie in [0, 1] and ``w`` is comparable across
  workloads. LMetric's paper found ``w = 0.7`` best for chat traffic and 0.55
  for API traffic; 0.7 is the default.
* ``dynamo`` (NVIDIA Dynamo's KV router cost): ``prefill_weight · prefill_blocks + decode_blocks``
  with ``prefill_blocks = ceil(P-token / block_size)`` and ``decode_blocks`` =
  prompt blocks of the requests decoding on the instance, each rounded up. Dynamo's default
  weight is 1.0.

Ties: lower P-token, then lower BS, then seeded random.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from router_worker.routing.features import RequestFeatures
from router_worker.routing.indicators import ClusterView
from router_worker.routing.policies.base import Decision, PolicyParams, RoutingPolicy
from router_worker.routing.provenance import paper


class LinearParams(PolicyParams):
    variant: Literal["weighted_sum", "dynamo"] = Field(
        "weighted_sum",
        description="weighted_sum (normalised P-token/BS) or dynamo (blocks)",
        json_schema_extra=paper("BAILIAN, per the LMetric paper"),
    )
    w: float = Field(
        0.7,
        ge=0.0,
        le=1.0,
        description="weighted_sum: weight of P-token (0.7 chat, 0.55 API per LMetric's paper)",
        json_schema_extra=paper("LMetric paper, chat traffic"),
    )
    prefill_weight: float = Field(
        1.0,
        ge=0.0,
        description="dynamo: weight of prefill blocks against decode blocks",
        json_schema_extra=paper("NVIDIA Dynamo's KV router"),
    )


class LinearPolicy(RoutingPolicy):
    kind = "linear"
    description = "Weighted sum of pending prefill and decode load (BAILIAN / Dynamo style)."
    Params = LinearParams
    params: LinearParams

    def decide(self, request: RequestFeatures, view: ClusterView, now: float) -> Decision:
        allowed = self.eligible_mask(view)
        p_tokens = view.p_tokens(request)
        batch = view.batch_size
        if self.params.variant == "dynamo":
            scores = self._dynamo(view, p_tokens)
        else:
            scores = self._weighted_sum(p_tokens, batch, allowed)
        slot = self.pick_min((scores, p_tokens, batch), allowed)
        return self.decision(view, request, slot, "score", scores, allowed)

    def _weighted_sum(
        self, p_tokens: np.ndarray, batch: np.ndarray, allowed: np.ndarray
    ) -> np.ndarray:
        w = self.params.w
        return w * p_tokens / _norm(p_tokens, allowed) + (1 - w) * batch / _norm(batch, allowed)

    def _dynamo(self, view: ClusterView, p_tokens: np.ndarray) -> np.ndarray:
        block = view.block_size
        prefill_blocks = np.ceil(p_tokens / block)
        return self.params.prefill_weight * prefill_blocks + view.decode_blocks


def _norm(values: np.ndarray, allowed: np.ndarray) -> float:
    peak = float(values[allowed].max())
    return peak if peak > 0 else 1.0
