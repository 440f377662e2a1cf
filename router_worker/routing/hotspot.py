"""LMetric's KV hotspot detector (docs/algorithms.md, "lmetric's hotspot detector").

Prefix class
------------
A request's class is the longest prefix of it cached on some healthy
instance, provided that prefix is at least ``min_class_blocks`` blocks long;
the class id is the router hash of that prefix's last block, and
``M`` = the healthy instances holding the whole prefix. Requests with no such
prefix have no class (a cache miss cannot attract traffic). Classes whose
``M`` covers more than ``max_hit_fraction`` of the healthy instances are not
treated as hotspots: filtering out most of the cluster to relieve it would
create a worse one (our guard; the paper does not discuss it).

Window and ratio test
---------------------
A sliding window of the last ``window_s`` seconds of requests (class or not).
For class c: ``x`` = class-c requests in the window (including the current
one), ``x̄`` = all other requests, ``m = |M|``, ``m̄ = |healthy \\ M|``. The
class *cannot* form a hotspot when ``x/x̄ ≤ m/m̄``, tested as
``x·m̄ ≤ x̄·m`` (no division). ``x < min_class_requests`` also passes, so a
single early request does not raise an alarm.

State machine per class (every transition emits a :class:`HotspotTransition`)
--------------------------------------------------------------------------
* normal → **suspected** when the ratio test fails; it must then be
  confirmed by the *next* ``2·m`` class-c requests (m at suspicion time).
* suspected → **confirmed** when each of those ``2·m`` requests was placed
  on M by the product score; the request completing the count is still placed
  by the product, fallback starts with the next one.
* suspected → **dismissed** when the product places one of them outside M,
  or the ratio test passes again.
* confirmed: class-c requests are routed *load-only* over healthy \\ M
  (``hotspot_fallback``). As they land there, M grows; when the ratio test
  passes again (or no class-c request is left in the window) → **cleared**.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from router_worker.routing.features import RequestFeatures
from router_worker.routing.provenance import design, matrix, paper

TransitionKind = Literal["suspected", "confirmed", "dismissed", "cleared"]


class HotspotParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    enabled: bool = Field(
        True,
        description="run the hotspot detector; off = always route by the policy's score, "
        "never the load-only fallback",
        json_schema_extra=paper("LMetric"),
    )
    window_s: float = Field(
        30.0, gt=0, description="sliding window of requests, seconds", json_schema_extra=design()
    )
    min_class_blocks: int = Field(
        8,
        ge=1,
        description="shortest cached prefix (in blocks) that defines a class",
        json_schema_extra=design(),
    )
    min_class_requests: int = Field(
        8,
        ge=1,
        description="class requests needed in the window before suspecting",
        json_schema_extra=matrix(),
    )
    max_hit_fraction: float = Field(
        0.5,
        gt=0,
        le=1,
        description="ignore classes cached on more than this share of instances",
        json_schema_extra=matrix(),
    )


@dataclass(frozen=True, slots=True)
class PrefixClass:
    class_id: int
    prefix_blocks: int
    members: np.ndarray  # bool mask over slots: M


@dataclass(frozen=True, slots=True)
class HotspotTransition:
    kind: TransitionKind
    class_id: str
    prefix_blocks: int
    prefix_tokens: int
    x: int
    x_bar: int
    m: int
    m_bar: int
    window_s: float
    instances: tuple[str, ...]
    time: float
    request_id: str
    confirmations: int
    confirmations_needed: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class _ClassState:
    phase: Literal["suspected", "confirmed"]
    needed: int
    seen: int = 0


@dataclass(frozen=True, slots=True)
class _Counts:
    x: int
    x_bar: int
    m: int
    m_bar: int

    @property
    def cannot_be_hot(self) -> bool:
        return self.x * self.m_bar <= self.x_bar * self.m


class HotspotDetector:
    """Windowed per-class ratio test with two-step confirmation; pure (time is passed in)."""

    def __init__(self, params: HotspotParams) -> None:
        self.params = params
        self._window: deque[tuple[float, int | None]] = deque()
        self._class_counts: Counter[int] = Counter()
        self._states: dict[int, _ClassState] = {}
        self._last_class: dict[int, PrefixClass] = {}

    def classify(
        self, request: RequestFeatures, cached_blocks: np.ndarray, eligible: np.ndarray
    ) -> PrefixClass | None:
        """The request's prefix class, or None (see module docstring)."""
        longest = int(cached_blocks[eligible].max(initial=0))
        if longest < self.params.min_class_blocks:
            return None
        members = eligible & (cached_blocks >= longest)
        return PrefixClass(request.block_hashes[longest - 1], longest, members)

    def state_of(self, class_id: int) -> str:
        state = self._states.get(class_id)
        return "normal" if state is None else state.phase

    def update(
        self,
        request: RequestFeatures,
        prefix_class: PrefixClass | None,
        product_choice: int,
        eligible: np.ndarray,
        ids: tuple[str, ...],
        now: float,
    ) -> tuple[bool, list[HotspotTransition]]:
        """Record the request; return (use load-only fallback?, transition events)."""
        events = self._expire(now, request, ids)
        if prefix_class is None:
            self._window.append((now, None))
            return False, events
        class_id = prefix_class.class_id
        self._window.append((now, class_id))
        self._class_counts[class_id] += 1
        self._last_class[class_id] = prefix_class
        counts = self._counts(prefix_class, eligible)
        fallback, event_kind = self._step(prefix_class, counts, product_choice)
        if event_kind is not None:
            events.append(self._event(event_kind, prefix_class, counts, request, ids, now))
        if event_kind in ("dismissed", "cleared"):
            del self._states[class_id]
        return fallback, events

    def _step(
        self, prefix_class: PrefixClass, counts: _Counts, product_choice: int
    ) -> tuple[bool, TransitionKind | None]:
        state = self._states.get(prefix_class.class_id)
        hot_possible = not counts.cannot_be_hot and self._eligible_class(counts)
        if state is None:
            if hot_possible:
                self._states[prefix_class.class_id] = _ClassState("suspected", 2 * counts.m)
                return False, "suspected"
            return False, None
        if not hot_possible:
            return False, "dismissed" if state.phase == "suspected" else "cleared"
        if state.phase == "confirmed":
            return True, None
        if not prefix_class.members[product_choice]:
            return False, "dismissed"
        state.seen += 1
        if state.seen >= state.needed:
            state.phase = "confirmed"
            return False, "confirmed"
        return False, None

    def _eligible_class(self, counts: _Counts) -> bool:
        healthy = counts.m + counts.m_bar
        return (
            counts.m_bar > 0
            and counts.x >= self.params.min_class_requests
            and counts.m <= self.params.max_hit_fraction * healthy
        )

    def _counts(self, prefix_class: PrefixClass, eligible: np.ndarray) -> _Counts:
        x = self._class_counts[prefix_class.class_id]
        m = int(np.count_nonzero(prefix_class.members))
        return _Counts(x, len(self._window) - x, m, int(np.count_nonzero(eligible)) - m)

    def _expire(
        self, now: float, request: RequestFeatures, ids: tuple[str, ...]
    ) -> list[HotspotTransition]:
        events: list[HotspotTransition] = []
        horizon = now - self.params.window_s
        while self._window and self._window[0][0] <= horizon:
            _, class_id = self._window.popleft()
            if class_id is None:
                continue
            self._class_counts[class_id] -= 1
            if self._class_counts[class_id] > 0:
                continue
            del self._class_counts[class_id]
            last = self._last_class.pop(class_id)
            if class_id in self._states:
                del self._states[class_id]
                counts = _Counts(0, len(self._window), int(last.members.sum()), 0)
                events.append(self._event("cleared", last, counts, request, ids, now))
        return events

    def _event(
        self,
        kind: TransitionKind,
        prefix_class: PrefixClass,
        counts: _Counts,
        request: RequestFeatures,
        ids: tuple[str, ...],
        now: float,
    ) -> HotspotTransition:
        state = self._states.get(prefix_class.class_id)
        return HotspotTransition(
            kind=kind,
            class_id=f"{prefix_class.class_id:016x}",
            prefix_blocks=prefix_class.prefix_blocks,
            prefix_tokens=prefix_class.prefix_blocks * request.block_size,
            x=counts.x,
            x_bar=counts.x_bar,
            m=counts.m,
            m_bar=counts.m_bar,
            window_s=self.params.window_s,
            instances=tuple(ids[s] for s in np.flatnonzero(prefix_class.members)),
            time=now,
            request_id=request.request_id,
            confirmations=0 if state is None else state.seen,
            confirmations_needed=0 if state is None else state.needed,
        )
