"""Indicator state of a cluster: one set of update functions, one read-only view.

The live router (wall clock) and the replay simulator (virtual clock) call the
*same* methods of :class:`ClusterState`, always passing ``now`` (float
seconds) explicitly; nothing here reads a clock or does I/O.

A request's accounting (router-local; driven by :mod:`router_worker.routing.lifecycle`)::

    state.on_dispatch(features, instance_id, now)   # pending_prefill += uncached tokens,
                                                    # in_flight += 1 (in batch_size from
                                                    # now on), KV shadow insert
    state.on_first_token(request_id, now)           # pending prefill drained (counted
                                                    # in the cumulative prefilled); decoding
    state.on_finish(request_id, now)                # or on_error(request_id, now)

Other inputs: ``on_scrape`` (vLLM /metrics: running, waiting, KV usage,
capacity), ``on_kv_event`` / ``on_kv_event_batch`` (decoded vLLM KV events),
``set_health`` (healthy / draining / down), ``add_instance`` /
``remove_instance``, ``advance(now)`` (only moves the clock).

The state's clock is the latest ``now`` any of these calls passed (it never
goes backwards); it is what decides whether scraped external load has expired.

Definitions
-----------
* ``cached_tokens_i(r)`` = leading blocks of r held by i × block size, capped
  at ``prompt_tokens - 1`` (vLLM always recomputes the last prompt token, so a
  prompt is never fully free).
* ``P-token_i(r)`` = pending prefill tokens on i + prompt tokens − cached.
* ``batch_size`` (view), ``BS_i``: requests in i's running batch as the
  engine counts it — vLLM v1 schedules a request whose (chunked) prefill is in
  progress in the same batch as the decoding ones (it holds a sequence slot and
  a share of every step); only requests in the engine's waiting queue are not
  in it: requests past their first token plus admitted-not-started ones, the
  admitted ones estimated as below::

      batch_size = decoding + admitted + external
      decoding   = this router's requests on i past their first token, not finished
      admitted   = ours_not_started − ours_waiting
                 = (in_flight − decoding) − ours_waiting   (dispatched, no first token,
                                                            not in the engine's queue)

  - ``decoding`` and ``in_flight`` are router-local: always fresh, never
    reduced by a scrape. Without a usable scrape ``ours_waiting`` is 0, so
    batch_size = in_flight: every dispatched request counts as running, which
    is what vLLM does unless its KV memory is exhausted.
  - ``ours_waiting = min(ours_not_started, scraped waiting)``, with
    ``ours_not_started`` taken *now* and ``scraped waiting`` from the last
    scrape of i that carried ``running`` (0 if that scrape had no
    ``waiting``): this router's not-started requests are assumed to sit in the
    engine's waiting queue as far as its size allows (they are the newest;
    vLLM admits FCFS). It is 0 when i was never scraped, once the scrape has
    expired (same TTL as ``external``), or with ``use_scraped_load`` off.
  - ``external``: running requests on i that this router did *not* send
    (other routers, direct clients), measured at each scrape of i as what the
    engine reports minus what this router accounts for at that moment::

        external = max(scraped running − (in_flight − ours_waiting), 0)

    A scrape consistent with this router's own accounting therefore yields 0,
    so a router never sees its own requests twice; a stale scrape lower than
    the local count yields 0 too, never a negative. Right after a scrape,
    batch_size = max(scraped running, in_flight − ours_waiting).
  - ``external`` is frozen between scrapes and dropped once
    ``external_load_ttl_intervals`` scrape intervals pass without a fresh
    ``running`` value for i (instance unreachable, monitor stopped). The
    scrape interval is ``scrape_interval_s`` when given, else learned per
    instance from the spacing of its scrapes (EWMA; a gap counts at most
    twice the current estimate, so a missed scrape or an outage does not
    stretch it; 1 s until two scrapes were seen).
  - With ``use_scraped_load`` off, the view reports ``in_flight`` (decoding +
    all not-started requests), never anything scraped.
  - :meth:`ClusterState.snapshot` reports ``decoding`` (the router-local decode
    batch) beside ``in_flight``; the policies' BS is the view's ``batch_size``.

  Scraped ``waiting`` only serves the attribution above: external waiting
  requests are not added to ``pending_prefill`` (their prompt sizes are
  unknown), so P-token stays router-local.
* ``prefill_tps``: effective prefill throughput, an EWMA of
  ``(pending prefill tokens on i at dispatch, including r's own) / (first token − dispatch)``
  per request: the prefill work that had to drain before r's first token.
  ``estimated_ttft_i(r) = P-token_i(r) / prefill_tps_i``.

Instances live in *slots* (array positions); a removed instance keeps its
slot, marked down, so slot numbers in explanations stay stable.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from engine_interface.kv_events import KVEvent, KVEventBatch
from router_worker.routing.features import DEFAULT_BLOCK_SIZE, RequestFeatures
from router_worker.routing.grey import GreyDetector
from router_worker.routing.kvindex import GlobalTier, KVIndex


class Health(IntEnum):
    HEALTHY = 0
    DRAINING = 1  # finishes what it has, gets nothing new
    DOWN = 2


_Tokens = TypeVar("_Tokens", float, npt.NDArray[np.float64])


def attention_pairs(uncached: _Tokens, cached: _Tokens) -> _Tokens:
    """The (query, key) pairs a prefill of ``uncached`` tokens after ``cached`` ones
    computes: each new token attends to the cached ones and to the new ones before it."""
    return uncached * cached + 0.5 * uncached * uncached


class UnknownRequestError(KeyError):
    """An update named a request id that is not in flight."""


@dataclass(slots=True)
class _InFlight:
    slot: int
    uncached_tokens: int
    prompt_tokens: int
    dispatch_time: float
    work_ahead: float
    started: bool = False
    first_token_time: float = 0.0
    ended: bool = False
    request_id: str = ""

    @property
    def attention_pairs(self) -> float:
        """The attention pairs of its prefill (in ``pending_pairs`` until its first token)."""
        return attention_pairs(self.uncached_tokens, self.prompt_tokens - self.uncached_tokens)


@dataclass(frozen=True, slots=True)
class PrefillProgress:
    """An instance's prefill work for this router so far (grey detection's expected TPOT
    counts what it ran while a request decoded): the cumulative uncached tokens and attention
    pairs of the requests that reached their first token there; and the prompt it is taken
    to be prefilling now, the oldest one dispatched there still without its first token
    (the engine admits first come, first served), with when it started on it (its dispatch,
    or the last first token there, whichever is later). No such prompt: ``head_id`` None."""

    tokens: float
    pairs: float
    head_id: str | None = None
    head_tokens: float = 0.0
    head_pairs: float = 0.0
    head_since: float = 0.0


@dataclass(frozen=True, slots=True)
class InstanceState:
    """Snapshot of one instance's indicators (for dashboards and logs)."""

    instance_id: str
    slot: int
    health: Health
    pending_prefill_tokens: float
    decoding: float  # this router's requests past their first token (not the view's BS)
    in_flight: float
    decode_context_tokens: float
    scraped_running: float | None
    scraped_waiting: float | None
    kv_usage: float | None
    prefill_tps: float
    cached_blocks: int
    last_scrape: float | None
    external_running: float = 0.0  # what the view adds to batch_size now (0 once expired)


_ARRAYS = (
    "pending",
    "pending_pairs",
    "decoding",
    "in_flight",
    "context",
    "queued_context",
    "first_token_sum",
    "decode_blocks",
    "running",
    "waiting",
    "kv_usage",
    "kv_usage_or_zero",
    "tps",
    "last_scrape",
    "external",
    "external_until",
    "scrape_interval",
    "waiting_cap",
    "prefilled",
    "prefilled_pairs",
    "last_prefilled_at",
    "itl_sum",
    "itl_count",
    "step_sum",
    "step_count",
)

_FALLBACK_SCRAPE_INTERVAL_S = 1.0  # the live router's default router.scrape_interval_s
_SCRAPE_INTERVAL_ALPHA = 0.3


class ClusterState:
    """Mutable indicator state of one cluster; the only writer of its arrays."""

    # the float arrays of _ARRAYS, one entry per slot (created in __init__ by name)
    pending: npt.NDArray[np.float64]
    pending_pairs: npt.NDArray[np.float64]
    decoding: npt.NDArray[np.float64]
    in_flight: npt.NDArray[np.float64]
    context: npt.NDArray[np.float64]
    queued_context: npt.NDArray[np.float64]
    first_token_sum: npt.NDArray[np.float64]
    decode_blocks: npt.NDArray[np.float64]
    running: npt.NDArray[np.float64]
    waiting: npt.NDArray[np.float64]
    kv_usage: npt.NDArray[np.float64]
    kv_usage_or_zero: npt.NDArray[np.float64]  # kv_usage as np.nan_to_num gives it
    tps: npt.NDArray[np.float64]
    last_scrape: npt.NDArray[np.float64]
    external: npt.NDArray[np.float64]
    external_until: npt.NDArray[np.float64]
    scrape_interval: npt.NDArray[np.float64]
    waiting_cap: npt.NDArray[np.float64]
    # Cumulative, per slot: the uncached prompt tokens (and their attention pairs) of the
    # requests that reached their first token there, i.e. the prefill work the instance
    # completed for this router. Grey detection's expected TPOT takes the difference
    # between a request's first and last token: the prefill run between its decode steps.
    prefilled: npt.NDArray[np.float64]
    prefilled_pairs: npt.NDArray[np.float64]
    last_prefilled_at: npt.NDArray[np.float64]  # the latest first token there
    # The engine's inter-token latency histogram (_sum, _count) at its last scrape, and
    # the tokens of the interval before it with their summed latency (flow control's
    # step time: step_sum / step_count; 0 and 0 when unknown).
    itl_sum: npt.NDArray[np.float64]
    itl_count: npt.NDArray[np.float64]
    step_sum: npt.NDArray[np.float64]
    step_count: npt.NDArray[np.float64]

    def __init__(
        self,
        *,
        block_size: int = DEFAULT_BLOCK_SIZE,
        default_capacity_blocks: int = 100_000,
        default_prefill_tps: float = 10_000.0,
        prefill_tps_alpha: float = 0.2,
        use_scraped_load: bool = True,
        global_tier: GlobalTier | None = None,
        scrape_interval_s: float | None = None,
        external_load_ttl_intervals: float = 2.5,
    ) -> None:
        if default_prefill_tps <= 0 or not 0 < prefill_tps_alpha <= 1:
            raise ValueError("default_prefill_tps must be > 0 and prefill_tps_alpha in (0, 1]")
        if scrape_interval_s is not None and scrape_interval_s <= 0:
            raise ValueError("scrape_interval_s must be > 0 (or None to learn it)")
        if not external_load_ttl_intervals > 0:
            raise ValueError("external_load_ttl_intervals must be > 0")
        self.scrape_interval_s = scrape_interval_s
        self.external_load_ttl_intervals = external_load_ttl_intervals
        self.clock = -np.inf  # latest ``now`` seen; never moves backwards
        self.block_size = block_size
        self.default_capacity_blocks = default_capacity_blocks
        self.default_prefill_tps = default_prefill_tps
        self.prefill_tps_alpha = prefill_tps_alpha
        self.use_scraped_load = use_scraped_load
        self.global_tier = global_tier
        self.kv = KVIndex(block_size)
        self.ids: list[str] = []
        self._slot: dict[str, int] = {}
        self._requests: dict[str, _InFlight] = {}
        # Per slot, the requests dispatched there in order, until their first token or end
        # (the head is the prompt being prefilled: PrefillProgress).
        self._unstarted: list[deque[_InFlight]] = []
        # Told when a request's prefill ends (ClusterState.when_prefilled).
        self._prefill_waiters: dict[str, list[Callable[[float, bool], None]]] = {}
        self.health = np.zeros(0, dtype=np.int8)
        self.health_version = 0  # bumped by every write to ``health`` (views cache on it)
        # The KV index's per-slot capacity, mirrored here for the view (set only here).
        self.capacity = np.zeros(0, dtype=np.int64)
        for name in _ARRAYS:
            setattr(self, name, np.zeros(0))
        self.kv_version = 0
        self.error_count = 0
        self._view: ClusterView | None = None
        # Grey-failure detection (slow instances), fed and applied by the request
        # lifecycle before any policy decides; None: off.
        self.grey: GreyDetector | None = None

    # ----- membership ---------------------------------------------------------
    def add_instance(
        self,
        instance_id: str,
        *,
        capacity_blocks: int | None = None,
        health: Health = Health.HEALTHY,
        prefill_tps: float | None = None,
    ) -> int:
        """Add an instance (or revive a removed one); returns its slot."""
        if instance_id in self._slot:
            slot = self._slot[instance_id]
            self.health[slot] = health
            self.health_version += 1
            self._view = None
            return slot
        capacity = capacity_blocks or self.default_capacity_blocks
        slot = self.kv.add_slot(capacity)
        self.ids.append(instance_id)
        self._slot[instance_id] = slot
        self.health = np.append(self.health, np.int8(health))
        self.health_version += 1
        self.capacity = np.append(self.capacity, np.int64(capacity))
        for name in _ARRAYS:
            setattr(self, name, np.append(getattr(self, name), 0.0))
        self._unstarted.append(deque())
        self.running[slot] = self.waiting[slot] = self.kv_usage[slot] = np.nan
        self.last_scrape[slot] = self.external_until[slot] = self.scrape_interval[slot] = np.nan
        self.itl_count[slot] = np.nan
        self.tps[slot] = prefill_tps or self.default_prefill_tps
        self._view = None
        return slot

    def remove_instance(self, instance_id: str) -> None:
        """Mark down and forget its cache; in-flight requests may still finish."""
        slot = self.slot_of(instance_id)
        self.health[slot] = Health.DOWN
        self.health_version += 1
        self.kv.clear(slot)
        self.kv_version += 1
        self.external[slot] = self.waiting_cap[slot] = 0.0
        self.external_until[slot] = np.nan

    def set_health(self, instance_id: str, health: Health) -> None:
        self.health[self.slot_of(instance_id)] = health
        self.health_version += 1

    def slot_of(self, instance_id: str) -> int:
        try:
            return self._slot[instance_id]
        except KeyError:
            raise KeyError(f"unknown instance {instance_id!r}") from None

    # ----- request lifecycle ------------------------------------------------
    def on_dispatch(
        self,
        features: RequestFeatures,
        instance_id: str,
        now: float,
        *,
        cached_tokens: int | None = None,
    ) -> int:
        """Account a request sent to ``instance_id``; returns its uncached prompt tokens."""
        self._check_block_size(features)
        self.advance(now)
        if features.request_id in self._requests:
            raise ValueError(f"request {features.request_id!r} is already in flight")
        slot = self.slot_of(instance_id)
        if cached_tokens is None:
            cached_tokens = int(self.view().cached_tokens(features)[slot])
        uncached = max(features.prompt_tokens - cached_tokens, 0)
        self.pending[slot] += uncached
        self.pending_pairs[slot] += attention_pairs(uncached, features.prompt_tokens - uncached)
        self.in_flight[slot] += 1
        self.queued_context[slot] += features.prompt_tokens
        record = _InFlight(
            slot,
            uncached,
            features.prompt_tokens,
            now,
            float(self.pending[slot]),
            request_id=features.request_id,
        )
        self._requests[features.request_id] = record
        self._unstarted[slot].append(record)
        self.kv.insert(slot, features.block_hashes)
        if self.global_tier is not None:
            self.global_tier.insert(features.block_hashes)
        self.kv_version += 1
        return uncached

    def on_first_token(self, request_id: str, now: float) -> None:
        """First token seen: its prefill is done, it decodes (already in the view's BS)."""
        self.advance(now)
        record = self._record(request_id)
        if record.started:
            return
        record.started = True
        slot = record.slot
        self.pending[slot] -= record.uncached_tokens
        self.pending_pairs[slot] -= record.attention_pairs
        self.prefilled[slot] += record.uncached_tokens
        self.prefilled_pairs[slot] += record.attention_pairs
        self.last_prefilled_at[slot] = now
        self._trim_unstarted(slot)
        self.queued_context[slot] -= record.prompt_tokens
        self.decoding[slot] += 1
        self.first_token_sum[slot] += now
        record.first_token_time = now
        self.context[slot] += record.prompt_tokens
        self.decode_blocks[slot] += self._blocks_of(record.prompt_tokens)
        self._update_prefill_tps(slot, record.work_ahead, now - record.dispatch_time)
        for waiter in self._prefill_waiters.pop(request_id, ()):
            waiter(now, True)

    def on_finish(self, request_id: str, now: float) -> None:
        """Request ended normally; everything it added is removed."""
        self.advance(now)
        record = self._requests.pop(request_id, None)
        if record is None:
            raise UnknownRequestError(request_id)
        slot = record.slot
        record.ended = True
        if record.started:
            self.decoding[slot] -= 1
            self.first_token_sum[slot] -= record.first_token_time
            self.context[slot] -= record.prompt_tokens
            self.decode_blocks[slot] -= self._blocks_of(record.prompt_tokens)
        else:
            self.pending[slot] -= record.uncached_tokens
            self.pending_pairs[slot] -= record.attention_pairs
            self.queued_context[slot] -= record.prompt_tokens
            self._trim_unstarted(slot)
        self.in_flight[slot] -= 1
        for waiter in self._prefill_waiters.pop(request_id, ()):
            waiter(now, False)

    def on_error(self, request_id: str, now: float) -> None:
        """Request failed or was aborted (connect error, 5xx, client cancel)."""
        self.on_finish(request_id, now)
        self.error_count += 1

    def is_in_flight(self, request_id: str) -> bool:
        return request_id in self._requests

    def prefill_progress(self, instance_id: str) -> PrefillProgress:
        """The prefill ``instance_id`` completed for this router, and the prompt it is
        prefilling (:class:`PrefillProgress`)."""
        slot = self.slot_of(instance_id)
        done, pairs = float(self.prefilled[slot]), float(self.prefilled_pairs[slot])
        queue = self._unstarted[slot]
        if not queue:
            return PrefillProgress(done, pairs)
        head = queue[0]
        since = max(head.dispatch_time, float(self.last_prefilled_at[slot]))
        return PrefillProgress(
            done, pairs, head.request_id, head.uncached_tokens, head.attention_pairs, since
        )

    def when_prefilled(self, request_id: str, waiter: Callable[[float, bool], None]) -> None:
        """Call ``waiter(now, True)`` when ``request_id`` (in flight, no first token yet)
        reaches its first token, or ``waiter(now, False)`` when it ends without one."""
        record = self._record(request_id)
        if record.started:
            raise ValueError(f"request {request_id!r} already has its first token")
        self._prefill_waiters.setdefault(request_id, []).append(waiter)

    # ----- scrapes and engine events ---------------------------------------
    def on_scrape(
        self,
        instance_id: str,
        now: float,
        *,
        running: float | None = None,
        waiting: float | None = None,
        kv_usage: float | None = None,
        capacity_blocks: int | None = None,
        itl_totals: tuple[float, float] | None = None,
    ) -> None:
        """Values parsed from the instance's /metrics (vllm:num_requests_running, ...;
        ``itl_totals``: vllm:inter_token_latency_seconds' _sum and _count).

        Call it right after the scrape: ``running`` / ``waiting`` are compared
        with this router's accounting *now* to derive the external load (see
        the module docstring). ``waiting`` is only used together with
        ``running`` from the same scrape.
        """
        slot = self.slot_of(instance_id)
        self.advance(now)
        previous = self.last_scrape[slot]
        if now > previous:  # False while nan (first scrape)
            self._update_scrape_interval(slot, now - previous)
        if running is not None:
            self.running[slot] = running
            local = self.decoding[slot]
            in_flight = self.in_flight[slot]
            cap = waiting if waiting is not None else 0.0
            ours_waiting = max(min(in_flight - local, cap), 0.0)
            self.external[slot] = max(running - (in_flight - ours_waiting), 0.0)
            self.waiting_cap[slot] = max(cap, 0.0)
            ttl = self.external_load_ttl_intervals * self._interval(slot)
            self.external_until[slot] = now + ttl
        if waiting is not None:
            self.waiting[slot] = waiting
        if kv_usage is not None:
            self.kv_usage[slot] = kv_usage
            self.kv_usage_or_zero[slot] = np.nan_to_num(self.kv_usage[slot], nan=0.0)
        if capacity_blocks is not None and capacity_blocks > 0:
            self.kv.set_capacity(slot, capacity_blocks)
            self.capacity[slot] = capacity_blocks
            self.kv_version += 1
        if itl_totals is not None:
            self._on_itl(slot, *itl_totals)
        self.last_scrape[slot] = now

    def _on_itl(self, slot: int, total: float, count: float) -> None:
        """The tokens the engine produced since its last scrape and their summed
        inter-token latency; none known at its first scrape or after a restart (the
        counters went back)."""
        before = self.itl_count[slot]
        if count >= before:  # False while nan
            self.step_sum[slot] = total - self.itl_sum[slot]
            self.step_count[slot] = count - before
        else:
            self.step_sum[slot] = self.step_count[slot] = 0.0
        self.itl_sum[slot], self.itl_count[slot] = total, count

    def advance(self, now: float) -> None:
        """Move the state's clock to ``now`` (no other change); every update does this."""
        if now > self.clock:
            self.clock = now

    def on_kv_event(self, instance_id: str, event: KVEvent, now: float) -> None:
        self.advance(now)
        self.kv.apply_event(self.slot_of(instance_id), event)
        self.kv_version += 1

    def on_kv_event_batch(self, instance_id: str, batch: KVEventBatch, now: float) -> None:
        slot = self.slot_of(instance_id)
        self.advance(now)
        for event in batch.events:
            self.kv.apply_event(slot, event)
        self.kv_version += 1

    # ----- reading ------------------------------------------------------------
    def view(self) -> ClusterView:
        """The read-only view policies see (reflects later updates; do not cache data)."""
        if self._view is None:
            self._view = ClusterView(self)
        return self._view

    def snapshot(self, instance_id: str) -> InstanceState:
        slot = self.slot_of(instance_id)
        return InstanceState(
            instance_id=instance_id,
            slot=slot,
            health=Health(int(self.health[slot])),
            pending_prefill_tokens=float(self.pending[slot]),
            decoding=float(self.decoding[slot]),
            in_flight=float(self.in_flight[slot]),
            decode_context_tokens=float(self.context[slot]),
            scraped_running=_optional(self.running[slot]),
            scraped_waiting=_optional(self.waiting[slot]),
            kv_usage=_optional(self.kv_usage[slot]),
            prefill_tps=float(self.tps[slot]),
            cached_blocks=self.kv.held_count(slot),
            last_scrape=_optional(self.last_scrape[slot]),
            external_running=float(self.view().external_running[slot]),
        )

    def _blocks_of(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def _trim_unstarted(self, slot: int) -> None:
        queue = self._unstarted[slot]
        while queue and (queue[0].started or queue[0].ended):
            queue.popleft()

    def _record(self, request_id: str) -> _InFlight:
        try:
            return self._requests[request_id]
        except KeyError:
            raise UnknownRequestError(request_id) from None

    def _interval(self, slot: int) -> float:
        if self.scrape_interval_s is not None:
            return self.scrape_interval_s
        learned = self.scrape_interval[slot]
        return _FALLBACK_SCRAPE_INTERVAL_S if np.isnan(learned) else float(learned)

    def _update_scrape_interval(self, slot: int, gap: float) -> None:
        estimate = self.scrape_interval[slot]
        if np.isnan(estimate):
            self.scrape_interval[slot] = gap
            return
        gap = min(gap, 2.0 * estimate)  # a missed scrape or an outage barely moves it
        alpha = _SCRAPE_INTERVAL_ALPHA
        self.scrape_interval[slot] = (1 - alpha) * estimate + alpha * gap

    def _update_prefill_tps(self, slot: int, work: float, elapsed: float) -> None:
        if elapsed <= 0 or work <= 0:
            return
        alpha = self.prefill_tps_alpha
        self.tps[slot] = (1 - alpha) * self.tps[slot] + alpha * (work / elapsed)

    def _check_block_size(self, features: RequestFeatures) -> None:
        if features.block_size != self.block_size:
            raise ValueError(
                f"features hashed with block_size={features.block_size}, "
                f"cluster uses {self.block_size}"
            )


_HEALTHY = int(Health.HEALTHY)  # a plain int: comparing with the enum member is slower


def _optional(value: float) -> float | None:
    return None if np.isnan(value) else float(value)


def _readonly(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.flags.writeable = False
    return view


class ClusterView:
    """What a policy sees: read-only arrays indexed by slot, plus KV lookups.

    Arrays: ``pending_prefill``, ``pending_attention_pairs`` (the attention pairs those
    queued prefills compute, :func:`attention_pairs`), ``in_flight``, ``decode_context_tokens``,
    ``decode_blocks`` (Σ per decoding request of its prompt blocks),
    ``prefill_tps``, ``kv_usage`` (nan = never scraped; ``kv_usage_or_zero`` is it with
    nan as 0), ``capacity_blocks`` (the KV index's per-slot bound: scraped, else the
    configured default), ``health``, ``scraped_waiting`` (the engine's waiting queue as its
    last scrape reported it, nan = never scraped: vLLM's ``num_requests_waiting``, stale by
    up to a scrape interval, read only by rules that emulate routers which use it raw);
    ``batch_size`` (decoding + admitted + unexpired external: the engine's
    running batch, see the module docstring), ``ours_waiting`` and
    ``external_running`` are computed per call at the state's clock;
    ``held_blocks`` (the KV index's per-slot LRU size) per call too. ``eligible`` is a
    read-only bool mask of healthy slots.
    ``ids[slot]`` is the instance id.
    """

    def __init__(self, state: ClusterState) -> None:
        self._state = state
        self.ids: tuple[str, ...] = tuple(state.ids)
        self.block_size = state.block_size
        self.pending_prefill = _readonly(state.pending)
        self.pending_attention_pairs = _readonly(state.pending_pairs)
        self.in_flight = _readonly(state.in_flight)
        self.decode_context_tokens = _readonly(state.context)
        self.queued_context_tokens = _readonly(state.queued_context)
        self.decoding = _readonly(state.decoding)
        self.decode_blocks = _readonly(state.decode_blocks)
        self.prefill_tps = _readonly(state.tps)
        self.kv_usage = _readonly(state.kv_usage)
        self.kv_usage_or_zero = _readonly(state.kv_usage_or_zero)
        self.scraped_waiting = _readonly(state.waiting)
        self.health = _readonly(state.health)
        self.capacity_blocks = _readonly(state.capacity)
        self._eligible_version = -1
        self._eligible = np.zeros(0, dtype=bool)
        empty = np.zeros(0, dtype=np.int64)
        self._memo: tuple[RequestFeatures | None, int, np.ndarray, np.ndarray] = (
            None,
            -1,
            empty,
            empty,
        )

    @property
    def size(self) -> int:
        return len(self.ids)

    @property
    def eligible(self) -> np.ndarray:
        """Read-only; computed again only after a health changed (it is read by every
        decision, and numpy calls cost more than the comparison)."""
        version = self._state.health_version
        if self._eligible_version != version:
            self._eligible = _readonly(self._eligible_mask())
            self._eligible_version = version
        return self._eligible

    def _eligible_mask(self) -> np.ndarray:
        return self.health == _HEALTHY

    @property
    def external_running(self) -> np.ndarray:
        """Per slot, running requests other senders have on it (0 once expired)."""
        state = self._state
        # nan ``external_until`` (never scraped) compares False: no external load
        return state.external * (state.external_until > state.clock)

    @property
    def ours_waiting(self) -> np.ndarray:
        """Per slot, this router's not-started requests estimated to be queued in the engine."""
        state = self._state
        if not state.use_scraped_load:
            return np.zeros(state.in_flight.shape)
        fresh = state.external_until > state.clock  # nan (never scraped) compares False
        return np.minimum(state.in_flight - state.decoding, state.waiting_cap) * fresh

    @property
    def batch_size(self) -> np.ndarray:
        """Per slot, BS: requests in the engine's running batch (prefilling or decoding)."""
        state = self._state
        if not state.use_scraped_load:
            return _readonly(state.in_flight)
        return state.in_flight - self.ours_waiting + self.external_running

    @property
    def committed_batch(self) -> np.ndarray:
        """Per slot, the requests i has taken on: its running batch plus this router's
        requests queued in the engine (dispatched, no first token yet: behind a prefill or
        waiting for KV). Each will decode there and hold KV there until it finishes."""
        state = self._state
        if not state.use_scraped_load:
            return _readonly(state.in_flight)
        return state.in_flight + self.external_running

    @property
    def committed_context_tokens(self) -> np.ndarray:
        """Per slot, the prompt tokens of this router's requests decoding on i plus those
        dispatched there and not yet started (``decode_context_tokens`` +
        ``queued_context_tokens``)."""
        return self.decode_context_tokens + self.queued_context_tokens

    @property
    def decode_age_s(self) -> np.ndarray:
        """Per slot, the seconds this router's decoding requests on i have spent decoding
        (since their first tokens), summed, at the state's clock."""
        state = self._state
        if not np.isfinite(state.clock):
            return np.zeros(state.decoding.shape)
        return np.maximum(state.decoding * state.clock - state.first_token_sum, 0.0)

    @property
    def held_blocks(self) -> np.ndarray:
        """Per slot, blocks the KV index holds for it (its modelled prefix cache)."""
        kv = self._state.kv
        return np.array([kv.held_count(slot) for slot in range(self.size)], dtype=np.int64)

    @property
    def has_global_tier(self) -> bool:
        return self._state.global_tier is not None

    def cached_blocks(self, features: RequestFeatures) -> np.ndarray:
        """Per slot, leading blocks of the request held locally (memoised per request)."""
        return self._lookup(features)[2]

    def cached_tokens(self, features: RequestFeatures) -> np.ndarray:
        """Per slot, locally cached prompt tokens (memoised with ``cached_blocks``)."""
        return self._lookup(features)[3]

    def _lookup(
        self, features: RequestFeatures
    ) -> tuple[RequestFeatures | None, int, np.ndarray, np.ndarray]:
        memo = self._memo
        version = self._state.kv_version
        if memo[0] is features and memo[1] == version:
            return memo
        # block_hashes come from hash_blocks: a chain from the root
        blocks = self._state.kv.longest_prefixes(features.block_hashes, chain=True)
        tokens = np.minimum(blocks * features.block_size, max(features.prompt_tokens - 1, 0))
        blocks.flags.writeable = tokens.flags.writeable = False  # fresh arrays: freeze them
        memo = self._memo = (features, version, blocks, tokens)
        return memo

    def new_tokens(self, features: RequestFeatures) -> np.ndarray:
        """Prompt tokens each instance would have to prefill."""
        return features.prompt_tokens - self.cached_tokens(features)

    def p_tokens(
        self, features: RequestFeatures, *, tier_token_cost: float | None = None
    ) -> np.ndarray:
        """P-token: the prefill work ahead of r's first token on each instance, in tokens
        recomputed — the pending prefill plus r's tokens not cached locally.

        With ``tier_token_cost`` (the cost of loading one token from the global tier
        relative to recomputing it) and a global tier, the tier-held tokens beyond the
        local hit are charged at that fraction instead of a full token each.
        """
        work = self.pending_prefill + self.new_tokens(features)
        if tier_token_cost is not None and self.has_global_tier:
            work = work - self.tier_load_tokens(features) * (1.0 - tier_token_cost)
        return work

    def tier_load_tokens(self, features: RequestFeatures) -> np.ndarray:
        """Per slot, r's prompt tokens the global tier holds beyond the local hit: what the
        instance loads from the tier instead of prefilling (zeros without a tier)."""
        if not self.has_global_tier:
            return np.zeros(self.size)
        return np.maximum(self.global_tier_tokens(features) - self.cached_tokens(features), 0)

    def global_tier_tokens(self, features: RequestFeatures) -> int:
        """Leading prompt tokens held by the global tier (0 without a tier)."""
        tier = self._state.global_tier
        if tier is None:
            return 0
        blocks = tier.longest_prefix(features.block_hashes)
        return min(blocks * features.block_size, max(features.prompt_tokens - 1, 0))

    def estimated_ttft(
        self, features: RequestFeatures, *, tier_token_cost: float | None = None
    ) -> np.ndarray:
        """Seconds until r's first token on each instance: P-token / prefill throughput
        (``tier_token_cost`` as in :meth:`p_tokens`)."""
        return self.p_tokens(features, tier_token_cost=tier_token_cost) / self.prefill_tps
