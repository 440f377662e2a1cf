"""``smetric``: session-centric scheduling (docs/algorithms.md, "smetric").

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
seeded random. A first turn places a whole session, so it is placed by the queue
balance alone: drawing first turns to the instances holding their shared system
prompt piles sessions up there.

Follow-ups → the instance with the highest local hit (ties: lower estimated
TTFT, then random). If its estimated TTFT meets the request's SLO → stick
(``session_stick``). Otherwise the session migrates to the instance with the lowest
estimated TTFT — counting the hit it gives up, since the estimate is P-token there —
among those with at most ``migrate_max_queue_s`` of queued prefill, if that beats
sticking by ``migrate_margin`` (``session_migrate``); its cache then holds the session
for later turns. If no instance does, the follow-up sticks above its SLO
(``session_stick_over_slo``): moving would be slower still, and would throw the
session's cache away. (Migrating to the least-loaded instance whenever the SLO breaks,
the paper's rule, collapses under load: every estimate breaks the SLO, every follow-up
moves, and the hit ratio with it.) A follow-up with no local hit anywhere goes
least-loaded (``followup_no_hit``).

Follow-ups are placed only among the instances the decode guard leaves
(:mod:`router_worker.routing.policies.decode_guard`: their decode step with the request
within ``decode_slack`` of the fastest one's), so stickiness cannot pile decode onto the
instances holding a shared history; if none of those holds any of the prompt, the
follow-up goes least-loaded among them (``followup_decode_guard``). With ``kv_pressure``
(default; :mod:`router_worker.routing.kv_pressure`) the guard counts queued requests too,
and those instances are narrowed to the ones whose KV holds the follow-up with its expected
output while one does.

The SLO is per request: ``slo_ttft_s + slo_ttft_per_1k_prompt_s × u / 1000`` where u is
the prompt tokens the stick instance does *not* hold (its own prefill there). The paper
leaves open whether the SLO is a fixed TTFT, one that grows with the prompt, or one per
output token. A fixed TTFT cannot hold for long prompts; the length term makes the SLO a
bound on the *queueing* a sticky follow-up may suffer on top of its own prefill,
``slo_ttft_s``. Per-output-token SLOs concern TPOT, which the router does not steer with
this decision. A request that states its own TTFT SLO (the ``x-slo-ttft-ms`` header, as
llm-d names it) is held to that one instead.

Why the parameters are what they are:

* u, not the whole prompt: counting every prompt token gives a long follow-up that holds
  nearly all of its prompt a large allowance, so it queues for seconds before the rule
  looks elsewhere.
* ``slo_ttft_s`` is the queueing a session's cache is worth, i.e. prefill time: it scales
  with the engine's prefill throughput, not with the workload's own TTFT target.
* ``migrate_max_queue_s``: a migration recomputes the history the target lacks, and that
  work lands on a cluster that is either imbalanced (some instance has little queued:
  moving helps) or saturated (every instance queues seconds: moving only adds the
  recompute). The bound keeps the tight SLO from moving sessions on a saturated cluster.
* ``migrate_margin`` trades agent sessions (which gain from moving) against traces
  without turn information, where strong local hits stand in for follow-ups and more of
  them move.

The defaults were chosen on the whole evaluation matrix (``bench/replay/run.py``); the
runs behind them, and the alternatives measured and rejected (first turns by estimated
TTFT, decode interference in the estimate), are in bench/replay/ (HISTORY.md,
"SMetric's parameters").

Estimated TTFT = P-token / prefill throughput; with a global KV tier
configured, tokens the tier holds beyond the local hit are charged
``tier_token_cost`` × a recomputed token instead of a full one.

With a global KV tier (``tier_rebalance``, on by default) a follow-up does not stick
until its SLO breaks: its history follows it to any instance for the price of a tier
load, which the estimate above already charges. Among the instances where it would start
no later than where it is cached, it goes to the one with the fewest requests in flight
(the batch it joins, not only the prefill queue), then the earliest start, then the most
local hit (``session_stick`` when that is where it was, ``session_tier_rebalance``
otherwise). This is the paper's first insight — with a global tier, balancing load no
longer gives up KV reuse. Without a tier nothing changes.
"""

from __future__ import annotations

from dataclasses import replace

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
)
from router_worker.routing.policies.hotspot_guard import HotspotGuard, hotspot_field
from router_worker.routing.provenance import matrix, operational
from router_worker.routing.sessions import SessionTable


class SMetricParams(DecodeGuardParams):
    slo_ttft_s: float = Field(
        0.3,
        gt=0,
        description="TTFT SLO a sticky follow-up must meet: fixed part (the queueing its "
        "cache is worth), s",
        json_schema_extra=matrix(),
    )
    slo_ttft_per_1k_prompt_s: float = Field(
        0.15,
        ge=0,
        description="TTFT SLO: seconds added per 1000 prompt tokens the stick instance does "
        "not hold (the follow-up's own prefill there)",
        json_schema_extra=matrix(),
    )
    migrate_margin: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="migrate a follow-up over its SLO only if the target's estimated TTFT is "
        "at least this fraction below sticking",
        json_schema_extra=matrix(),
    )
    migrate_max_queue_s: float = Field(
        2.0,
        ge=0,
        description="migrate only to an instance with at most this much queued prefill, s "
        "(past it the cluster is saturated and a migration only adds its recompute)",
        json_schema_extra=matrix(),
    )
    followup_hit_ratio: float = Field(
        0.5,
        gt=0,
        le=1,
        description="no turn/session info: hit share that marks a follow-up",
        json_schema_extra=matrix(),
    )
    followup_min_hit_tokens: int = Field(
        256,
        ge=0,
        description="no turn/session info: minimum hit tokens for a follow-up",
        json_schema_extra=matrix(),
    )
    tier_token_cost: float = Field(
        0.1,
        ge=0,
        le=1,
        description="global-tier load cost per token relative to recompute",
        json_schema_extra=matrix(),
    )
    tier_rebalance: bool = Field(
        True,
        description="with a global KV tier, send each follow-up to the instance with the "
        "fewest requests in flight among those where it would start no later than where "
        "it is cached (its history loads from the tier), instead of sticking until the "
        "SLO breaks",
        json_schema_extra=matrix(),
    )
    session_table_size: int = Field(
        100_000, ge=1, description="sessions remembered (LRU)", json_schema_extra=operational()
    )
    hotspot: HotspotParams = hotspot_field()


class SMetricPolicy(DecodeGuardedPolicy):
    kind = "smetric"
    description = "First turns to the least-loaded instance; follow-ups stick unless SLO breaks."
    Params = SMetricParams
    params: SMetricParams

    def __init__(self, params: PolicyParams | None = None, seed: int = 0) -> None:
        super().__init__(params, seed)
        self.sessions = SessionTable(self.params.session_table_size)
        self.guard = HotspotGuard(self.params.hotspot)

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
            roomy = self._roomy(request, view, allowed)
            if hit[roomy].max() <= 0:
                decision = self._least_loaded(view, request, roomy, load, "followup_decode_guard")
            else:
                decision = self._follow_up(view, request, roomy, hit, load)
        decision = self._guard_hotspot(request, view, allowed, load, decision, now)
        decision.details["turn_basis"] = basis
        if request.session_key is not None:
            self.sessions.put(request.session_key, decision.instance_id)
        return decision

    def _guard_hotspot(
        self,
        request: RequestFeatures,
        view: ClusterView,
        allowed: np.ndarray,
        load: np.ndarray,
        decision: Decision,
        now: float,
    ) -> Decision:
        """While the request's prefix class is confirmed hot, place it as a first turn
        among the instances outside the class's holders (their decode headroom first)."""
        verdict = self.guard.check(request, view, allowed, decision.slot, now)
        if verdict.outside is None:
            return replace(decision, events=tuple(verdict.events)) if verdict.events else decision
        roomy = self._roomy(request, view, verdict.outside)
        fallback = self._least_loaded(view, request, roomy, load, "hotspot_fallback")
        fallback.details.update(verdict.details())
        return replace(fallback, events=tuple(verdict.events))

    def _roomy(
        self, request: RequestFeatures, view: ClusterView, allowed: np.ndarray
    ) -> np.ndarray:
        """The allowed instances within the decode guard's bound whose KV holds the request
        (KV pressure; :mod:`router_worker.routing.kv_pressure`)."""
        roomy = decode_headroom(request, view, allowed, self.params)
        if self.params.kv_pressure:
            roomy = kv_room(request, view, roomy, self.outputs)
        return roomy

    def _is_follow_up(
        self, request: RequestFeatures, hit: np.ndarray, allowed: np.ndarray
    ) -> tuple[bool, str]:
        if request.turn_index is not None:
            return request.turn_index > 0, "turn_index"
        if request.session_key is not None:
            return self.sessions.get(request.session_key) is not None, "session_key"
        best = float(hit[allowed].max())
        strong = (
            best >= self.params.followup_hit_ratio * request.prompt_tokens
            and best >= self.params.followup_min_hit_tokens
            and best > 0
        )
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
        slo = self.slo_for(request, float(hit[slot]))
        if view.has_global_tier and self.params.tier_rebalance:
            return self._tier_follow_up(view, request, allowed, hit, ttft, slot, slo)
        if estimate <= slo:
            return self.decision(
                view,
                request,
                slot,
                "session_stick",
                ttft,
                allowed,
                estimated_ttft_s=estimate,
                slo_s=slo,
            )
        spare = allowed & (load <= self.params.migrate_max_queue_s)
        spare[slot] = True  # sticking is always a candidate: no spare instance → stay
        target = self.pick_min((ttft, load), spare)
        if float(ttft[target]) < (1.0 - self.params.migrate_margin) * estimate:
            return self.decision(
                view,
                request,
                target,
                "session_migrate",
                ttft,
                allowed,
                estimated_ttft_s=float(ttft[target]),
                slo_s=slo,
                stick_candidate=view.ids[slot],
                stick_ttft_s=estimate,
            )
        return self.decision(
            view,
            request,
            slot,
            "session_stick_over_slo",
            ttft,
            allowed,
            estimated_ttft_s=estimate,
            slo_s=slo,
            best_alternative_ttft_s=float(ttft[target]),
        )

    def _tier_follow_up(
        self,
        view: ClusterView,
        request: RequestFeatures,
        allowed: np.ndarray,
        hit: np.ndarray,
        ttft: np.ndarray,
        slot: int,
        slo: float,
    ) -> Decision:
        """With a global tier the session's history follows it anywhere for the price of a
        tier load, which ``ttft`` already charges. Among the instances where the follow-up
        would start no later than where it is cached, the one with the fewest requests in
        flight (its batch as well as its queue), then the earliest start, then the most
        of the session held locally."""
        no_later = allowed & (ttft <= ttft[slot])
        target = self.pick_min((view.in_flight, ttft, -hit), no_later)
        reason = "session_stick" if target == slot else "session_tier_rebalance"
        return self.decision(
            view,
            request,
            target,
            reason,
            ttft,
            allowed,
            estimated_ttft_s=float(ttft[target]),
            slo_s=slo,
            stick_candidate=view.ids[slot],
        )

    def slo_for(self, request: RequestFeatures, cached_tokens: float = 0.0) -> float:
        """The request's TTFT SLO in seconds on an instance holding ``cached_tokens`` of
        its prompt (see the module docstring); the request's own SLO when it states one
        (``x-slo-ttft-ms``)."""
        if request.slo_ttft_s is not None:
            return request.slo_ttft_s
        uncached = max(request.prompt_tokens - cached_tokens, 0.0)
        return self.params.slo_ttft_s + self.params.slo_ttft_per_1k_prompt_s * uncached / 1000.0
