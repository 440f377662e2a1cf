"""Sampled routing decisions for the live view: which decisions are kept, and their records.

Operators need to see why requests went where they did, but a router makes hundreds of
decisions a second and most are alike. Routine decisions pass a token bucket (a few per
second per router). Decisions that involve a hotspot class, a fallback or a retry pass a
second, larger bucket, so they are kept even while routine ones are skipped, and a storm of
them stays bounded too.

The indicators behind each candidate's score are copied at decision time, and only for
admitted decisions; the record itself is built once the request has finished (off the
request's critical path), when its outcome (instance, attempts, status, TTFT) is known.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from router_worker.contract.telemetry import MAX_DECISION_CANDIDATES, CandidateScore
from router_worker.routing import Decision, RequestFeatures
from router_worker.routing.indicators import ClusterView

ROUTINE_PER_S = 2.0
ROUTINE_BURST = 4.0
PRIORITY_PER_S = 20.0
PRIORITY_BURST = 20.0

Scalar = float | int | str | bool | None


class TokenBucket:
    """``rate`` admissions per second on average, at most ``burst`` at once."""

    __slots__ = ("burst", "rate", "tokens", "updated")

    def __init__(self, rate: float, burst: float) -> None:
        self.rate, self.burst = rate, burst
        self.tokens = burst
        self.updated: float | None = None

    def take(self, now: float) -> bool:
        if self.updated is not None:
            self.tokens = min(self.burst, self.tokens + max(now - self.updated, 0.0) * self.rate)
        self.updated = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class DecisionSampler:
    """Admits routine decisions at a few per second and priority ones at a higher bound."""

    def __init__(
        self,
        routine: tuple[float, float] = (ROUTINE_PER_S, ROUTINE_BURST),
        priority: tuple[float, float] = (PRIORITY_PER_S, PRIORITY_BURST),
    ) -> None:
        self.routine = TokenBucket(*routine)
        self.priority = TokenBucket(*priority)
        self.kept = {"routine": 0, "priority": 0}
        self.skipped = {"routine": 0, "priority": 0}

    def admit(self, priority: bool, now: float) -> bool:
        """Whether to keep a decision made at ``now`` (a monotonic clock, in seconds)."""
        kind = "priority" if priority else "routine"
        admitted = (self.priority if priority else self.routine).take(now)
        (self.kept if admitted else self.skipped)[kind] += 1
        return admitted


def is_priority(decision: Decision) -> bool:
    """A decision operators always want to see: a fallback, or a hotspot class involved."""
    return (
        decision.reason.endswith("_fallback")
        or "hot_class" in decision.details
        or bool(decision.events)
    )


@dataclass(frozen=True, slots=True)
class Indicators:
    """Per slot, what the candidates' scores were computed from (copied at decision time)."""

    cached_tokens: np.ndarray
    pending_prefill_tokens: np.ndarray
    batch_size: np.ndarray


@dataclass(frozen=True, slots=True)
class CapturedDecision:
    priority: bool
    indicators: Indicators | None  # None: admitted only after the fact (a retry)


def capture(
    decision: Decision, view: ClusterView, features: RequestFeatures, priority: bool
) -> CapturedDecision:
    """Copy the indicators behind ``decision``; call right after the policy decided."""
    return CapturedDecision(
        priority,
        Indicators(
            cached_tokens=view.cached_tokens(features),  # a fresh array, frozen by the view
            pending_prefill_tokens=np.array(view.pending_prefill, dtype=float),
            batch_size=np.array(view.batch_size, dtype=float),
        ),
    )


def candidate_rows(
    decision: Decision,
    members: Iterable[str],
    indicators: Indicators | None,
    chosen: str | None = None,
    limit: int = MAX_DECISION_CANDIDATES,
) -> tuple[list[CandidateScore], int]:
    """The arm's candidates, best score first, filtered ones last; at most ``limit`` of
    them, always with the chosen one. Returns (rows, how many candidates there were)."""
    ids = decision.candidate_ids
    scores = [_finite(s) for s in decision.scores.tolist()]
    arm = set(members)
    slots = [s for s, name in enumerate(ids) if name in arm or scores[s] is not None]
    slots.sort(key=lambda s: (scores[s] is None, scores[s] or 0.0, ids[s]))
    kept = slots[:limit]
    chosen_slot = ids.index(chosen) if chosen in ids else decision.slot
    if chosen_slot in slots and chosen_slot not in kept:
        kept[-1] = chosen_slot
    if indicators is None:
        return [CandidateScore(instance=ids[s], score=scores[s]) for s in kept], len(slots)
    # Plain lists: indexing numpy arrays element by element costs more than converting.
    cached = indicators.cached_tokens.tolist()
    pending = indicators.pending_prefill_tokens.tolist()
    batch = indicators.batch_size.tolist()
    rows = [
        CandidateScore(
            instance=ids[s],
            score=scores[s],
            cached_tokens=int(cached[s]),
            pending_prefill_tokens=_finite(pending[s]),
            batch_size=_finite(batch[s]),
        )
        if s < len(cached)
        else CandidateScore(instance=ids[s], score=scores[s])
        for s in kept
    ]
    return rows, len(slots)


def scalar_details(details: dict[str, Any]) -> dict[str, Scalar]:
    """The decision's details that are plain values (JSON-safe; non-finite → None)."""
    out: dict[str, Scalar] = {}
    for key, value in details.items():
        if isinstance(value, np.generic):
            value = value.item()
        if isinstance(value, float):
            out[key] = _finite(value)
        elif value is None or isinstance(value, bool | int | str):
            out[key] = value
    return out


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
