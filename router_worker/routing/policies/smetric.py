"""``smetric``: session-centric scheduling (seed 004).

Is the request a follow-up? Decided statelessly, first rule that applies:

1. ``turn_index`` known (chat: earlier assistant messages) → follow-up iff > 0;
2. ``session_key`` known (``X-Session-ID`` or body ``user``) → follow-up iff
   this router has routed that session before (bounded LRU table);
3. neither → follow-up iff a *strong local hit* exists: some healthy
   instance holds at least ``followup_hit_ratio`` of the prompt and at least
   ``followup_min_hit_tokens`` tokens (a shared system prompt alone is usually
   shorter than half a follow-up's prompt, a session's history is not).

First turns → least-loaded instance (``first_turn_balance``): load = pending
prefill tokens / prefill throughput (seconds of queued prefill), ties by lower
BS (the view's ``batch_size``: running requests, prefilling or decoding), then
seeded random.

Follow-ups → the instance with the highest local hit (ties: lower estimated
TTFT, then random). If its estimated TTFT ≤ ``slo_ttft_s`` → stick
(``session_stick``); else the session migrates to the least-loaded instance
(``session_migrate``), whose cache then holds the session for later turns.
A follow-up with no local hit anywhere goes least-loaded (``followup_no_hit``).

Estimated TTFT = P-token / prefill throughput; with a global KV tier
configured, tokens the tier holds beyond the local hit are charged
``tier_token_cost`` × a recomputed token instead of a full one.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from router_worker.routing.features import RequestFeatures
from router_worker.routing.indicators import ClusterView
from router_worker.routing.policies.base import Decision, Policy, PolicyParams
from router_worker.routing.sessions import SessionTable


class SMetricParams(PolicyParams):
    slo_ttft_s: float = Field(2.0, gt=0, description="TTFT SLO a sticky follow-up must meet, s")
    followup_hit_ratio: float = Field(
        0.5, gt=0, le=1, description="no turn/session info: hit share that marks a follow-up"
    )
    followup_min_hit_tokens: int = Field(
        256, ge=0, description="no turn/session info: minimum hit tokens for a follow-up"
    )
    tier_token_cost: float = Field(
        0.1, ge=0, le=1, description="global-tier load cost per token relative to recompute"
    )
    session_table_size: int = Field(100_000, ge=1, description="sessions remembered (LRU)")


class SMetricPolicy(Policy):
    kind = "smetric"
    description = "First turns to the least-loaded instance; follow-ups stick unless SLO breaks."
    Params = SMetricParams
    params: SMetricParams

    def __init__(self, params: PolicyParams | None = None, seed: int = 0) -> None:
        super().__init__(params, seed)
        self.sessions = SessionTable(self.params.session_table_size)

    def decide(self, request: RequestFeatures, view: ClusterView, now: float) -> Decision:
        allowed = self.eligible_mask(view)
        hit = view.cached_tokens(request)
        follow_up, basis = self._is_follow_up(request, hit, allowed)
        load = view.pending_prefill / view.prefill_tps
        if not follow_up:
            decision = self._least_loaded(view, request, allowed, load, "first_turn_balance")
        elif hit[allowed].max() <= 0:
            decision = self._least_loaded(view, request, allowed, load, "followup_no_hit")
        else:
            decision = self._follow_up(view, request, allowed, hit, load)
        decision.details["turn_basis"] = basis
        if request.session_key is not None:
            self.sessions.put(request.session_key, decision.instance_id)
        return decision

    def _is_follow_up(
        self, request: RequestFeatures, hit: np.ndarray, allowed: np.ndarray
    ) -> tuple[bool, str]:
        if request.turn_index is not None:
            return request.turn_index > 0, "turn_index"
        if request.session_key is not None:
            return self.sessions.get(request.session_key) is not None, "session_key"
        best = float(hit[allowed].max())
        strong = (best >= self.params.followup_hit_ratio * request.prompt_tokens
                  and best >= self.params.followup_min_hit_tokens and best > 0)
        return strong, "local_hit"

    def _least_loaded(
        self,
        view: ClusterView,
        request: RequestFeatures,
        allowed: np.ndarray,
        load: np.ndarray,
        reason: str,
    ) -> Decision:
        slot = self.pick_min((load, view.batch_size), allowed)
        return self.decision(view, request, slot, reason, load, allowed)

    def _follow_up(
        self,
        view: ClusterView,
        request: RequestFeatures,
        allowed: np.ndarray,
        hit: np.ndarray,
        load: np.ndarray,
    ) -> Decision:
        ttft = view.estimated_ttft(request, tier_token_cost=self.params.tier_token_cost)
        slot = self.pick_min((-hit, ttft), allowed)
        estimate = float(ttft[slot])
        if estimate <= self.params.slo_ttft_s:
            return self.decision(view, request, slot, "session_stick", ttft, allowed,
                                 estimated_ttft_s=estimate)
        decision = self._least_loaded(view, request, allowed, load, "session_migrate")
        decision.details.update(stick_candidate=view.ids[slot], stick_ttft_s=estimate)
        return decision
