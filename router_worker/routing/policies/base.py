"""The policy interface shared by every routing policy.

A policy is built from validated parameters and a seed and is then asked, per
request, ``decide(request, view, now) -> Decision``. Every rule has the same
shape: filters → per-instance score → minimum; ties are broken by the policy's
documented secondary keys, then by a seeded random choice (never list order).

Policies may keep windows and tables (hotspot detector, hotness tree, session
table); they update them only from the arguments they are given, so the
simulator and the live router get identical behaviour for identical inputs.
Feedback they may use arrives through ``observe_first_token`` and
``observe_finish``; the default is to ignore it.

A policy that sets ``migrates`` may also move requests that are queued (dispatched, no
first token yet): after each dispatch the driver passes the requests queued on the
instances the decision named (the chosen one and ``details["candidates"]``, so an
instance the policy just routed around is looked at too) to ``migrations(view, queued,
now)`` and executes what it returns (abort there, send to the target). The default
returns nothing, and drivers skip the call (and the work of listing the queue) for
policies that do not set ``migrates``.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from math import isnan
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from router_worker.routing.features import RequestFeatures
from router_worker.routing.indicators import ClusterView


class NoEligibleInstanceError(RuntimeError):
    """No healthy instance to route to (empty cluster, or all draining/down)."""


class PolicyParams(BaseModel):
    """Base of every policy's parameters: immutable, unknown fields rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


@dataclass(frozen=True, slots=True)
class Decision:
    """The chosen instance and why.

    ``scores[slot]`` is the policy's primary score per instance (``inf`` for
    instances the filters removed); ``candidate_ids[slot]`` names them.
    ``reason`` is a short code (``score``, ``hotspot_fallback``,
    ``session_stick``, ...). ``events`` carries hotspot transitions raised by
    this decision. ``cached_tokens`` is the chosen instance's local hit, to
    pass on to ``ClusterState.on_dispatch``.
    """

    instance_id: str
    slot: int
    reason: str
    cached_tokens: int
    candidate_ids: tuple[str, ...]
    scores: np.ndarray
    details: dict[str, Any] = field(default_factory=dict)
    events: tuple[Any, ...] = ()

    def score_table(self) -> dict[str, float | None]:
        """Per-candidate scores for headers, logs and the dashboard (None = filtered)."""
        return {
            instance_id: (None if not np.isfinite(score) else float(score))
            for instance_id, score in zip(self.candidate_ids, self.scores.tolist(), strict=True)
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "instance": self.instance_id,
            "reason": self.reason,
            "cached_tokens": self.cached_tokens,
            "scores": self.score_table(),
            "details": self.details,
            "events": [getattr(e, "to_dict", lambda e=e: e)() for e in self.events],
        }


@dataclass(frozen=True, slots=True)
class QueuedRequest:
    """A request the driver dispatched that has no first token yet.

    ``candidates``: the instance ids its decision named (``details["candidates"]``),
    ``uncached_tokens``: its prefill work as accounted at dispatch; ``movable``: the driver
    can still take it back (the simulator knows whether the engine has admitted it; the
    live router only knows no byte came back).
    """

    features: RequestFeatures
    instance_id: str
    dispatch_time: float
    uncached_tokens: int
    candidates: tuple[str, ...] = ()
    movable: bool = True


@dataclass(frozen=True, slots=True)
class Migration:
    """Move queued request ``request_id`` from ``source`` to ``target``."""

    request_id: str
    source: str
    target: str
    benefit_s: float  # estimated TTFT saved


class RoutingPolicy(ABC):
    """One routing policy. Subclasses set ``kind``, ``description`` and ``Params``."""

    kind: ClassVar[str]
    description: ClassVar[str]
    Params: ClassVar[type[PolicyParams]]
    migrates: bool = False  # drivers call ``migrations`` only when set (may vary by params)

    def __init__(self, params: PolicyParams | None = None, seed: int = 0) -> None:
        self.params = params if params is not None else self.Params()
        if not isinstance(self.params, self.Params):
            raise TypeError(f"{self.kind} needs {self.Params.__name__}, got {type(params)}")
        self.seed = seed
        self.rng = random.Random(seed)

    @abstractmethod
    def decide(self, request: RequestFeatures, view: ClusterView, now: float) -> Decision:
        """Choose an instance for ``request``; raises NoEligibleInstanceError if none."""

    def observe_first_token(
        self, request: RequestFeatures, instance_id: str, ttft: float, now: float
    ) -> None:
        """Feedback: ``request`` got its first token on ``instance_id`` after ``ttft`` s."""
        return None  # most policies need no feedback

    def observe_finish(
        self, request: RequestFeatures, instance_id: str, output_tokens: int, now: float
    ) -> None:
        """Feedback: ``request`` finished on ``instance_id`` after ``output_tokens`` tokens."""
        return None

    def migrations(
        self, view: ClusterView, queued: Sequence[QueuedRequest], now: float
    ) -> list[Migration]:
        """Queued requests to move elsewhere, in the order to move them (default: none)."""
        return []

    # ----- helpers for subclasses ---------------------------------------------
    def eligible_mask(self, view: ClusterView) -> np.ndarray:
        mask = view.eligible
        if not mask.any():
            raise NoEligibleInstanceError(
                f"{self.kind}: no healthy instance among {view.size} "
                "(cluster empty, or every instance draining or down)"
            )
        return mask

    def pick_min(self, keys: Sequence[np.ndarray], allowed: np.ndarray) -> int:
        """Slot minimising ``keys`` lexicographically over ``allowed``; random among ties.

        Plain Python over lists: a cluster has a handful to a few hundred slots, where
        the dozen numpy calls this took cost more than the loop (it is on every
        decision). Same result: slots stay in ascending order, and a nan among the tied
        values empties the set (then pick_random raises), as numpy's minimum propagates it.
        """
        tied = [slot for slot, ok in enumerate(allowed.tolist()) if ok]
        for key in keys:
            if len(tied) <= 1:
                break  # decided (or nothing allowed: pick_random raises)
            column = key.tolist()
            values = [column[slot] for slot in tied]
            if any(map(isnan, values)):
                tied = []
                break
            best = min(values)
            tied = [slot for slot, value in zip(tied, values, strict=True) if value == best]
        return self.pick_random(tied)

    def pick_random(self, slots: Sequence[int] | np.ndarray) -> int:
        if len(slots) == 1:
            return int(slots[0])
        return int(slots[self.rng.randrange(len(slots))])

    def decision(
        self,
        view: ClusterView,
        request: RequestFeatures,
        slot: int,
        reason: str,
        scores: np.ndarray,
        allowed: np.ndarray,
        **details: Any,
    ) -> Decision:
        events = details.pop("events", ())
        return Decision(
            instance_id=view.ids[slot],
            slot=slot,
            reason=reason,
            cached_tokens=int(view.cached_tokens(request)[slot]),
            candidate_ids=view.ids,
            scores=np.where(allowed, scores, np.inf),
            details=details,
            events=tuple(events),
        )
