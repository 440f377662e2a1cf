"""Indicator state of a cluster: one set of update functions, one read-only view.

The live router (wall clock) and the replay simulator (virtual clock) call the
*same* methods of :class:`ClusterState`, always passing ``now`` (float
seconds) explicitly; nothing here reads a clock or does I/O.

Request lifecycle (router-local accounting, DESIGN.md §3)::

    state.on_dispatch(features, instance_id, now)   # pending_prefill += uncached tokens,
                                                    # in_flight += 1, KV shadow insert
    state.on_first_token(request_id, now)           # pending -> batch_size
    state.on_finish(request_id, now)                # or on_error(request_id, now)

Other inputs: ``on_scrape`` (vLLM /metrics: running, waiting, KV usage,
capacity), ``on_kv_event`` / ``on_kv_event_batch`` (decoded vLLM KV events),
``set_health`` (healthy / draining / down), ``add_instance`` /
``remove_instance``.

Definitions
-----------
* ``cached_tokens_i(r)`` = leading blocks of r held by i × block size, capped
  at ``prompt_tokens - 1`` (vLLM always recomputes the last prompt token, so a
  prompt is never fully free).
* ``P-token_i(r)`` = pending prefill tokens on i + prompt tokens − cached.
* ``batch_size``: requests on i past their first token and not finished. When
  ``use_scraped_load`` is on, the view reports ``max(local, scraped running)``
  so load the router did not send (other routers, direct clients) is seen; the
  scrape is up to one scrape interval stale, which is why local accounting
  stays primary.
* ``prefill_tps``: effective prefill throughput, an EWMA of
  ``(pending prefill tokens on i at dispatch, including r's own) / (first token − dispatch)``
  per request: the prefill work that had to drain before r's first token.
  ``estimated_ttft_i(r) = P-token_i(r) / prefill_tps_i``.

Instances live in *slots* (array positions); a removed instance keeps its
slot, marked down, so slot numbers in explanations stay stable.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from router_worker.routing.features import DEFAULT_BLOCK_SIZE, RequestFeatures
from router_worker.routing.kv_events import KVEvent, KVEventBatch
from router_worker.routing.kvindex import GlobalTier, KVIndex


class Health(IntEnum):
    HEALTHY = 0
    DRAINING = 1  # finishes what it has, gets nothing new
    DOWN = 2


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


@dataclass(frozen=True, slots=True)
class InstanceState:
    """Snapshot of one instance's indicators (for dashboards and logs)."""

    instance_id: str
    slot: int
    health: Health
    pending_prefill_tokens: float
    batch_size: float
    in_flight: float
    decode_context_tokens: float
    scraped_running: float | None
    scraped_waiting: float | None
    kv_usage: float | None
    prefill_tps: float
    cached_blocks: int
    last_scrape: float | None


_ARRAYS = ("pending", "batch", "in_flight", "context", "decode_blocks", "running", "waiting",
           "kv_usage", "tps", "last_scrape")


class ClusterState:
    """Mutable indicator state of one cluster; the only writer of its arrays."""

    def __init__(
        self,
        *,
        block_size: int = DEFAULT_BLOCK_SIZE,
        default_capacity_blocks: int = 100_000,
        default_prefill_tps: float = 10_000.0,
        prefill_tps_alpha: float = 0.2,
        use_scraped_load: bool = True,
        global_tier: GlobalTier | None = None,
    ) -> None:
        if default_prefill_tps <= 0 or not 0 < prefill_tps_alpha <= 1:
            raise ValueError("default_prefill_tps must be > 0 and prefill_tps_alpha in (0, 1]")
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
        self.health = np.zeros(0, dtype=np.int8)
        for name in _ARRAYS:
            setattr(self, name, np.zeros(0))
        self.kv_version = 0
        self.error_count = 0
        self._view: ClusterView | None = None

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
            self._view = None
            return slot
        slot = self.kv.add_slot(capacity_blocks or self.default_capacity_blocks)
        self.ids.append(instance_id)
        self._slot[instance_id] = slot
        self.health = np.append(self.health, np.int8(health))
        for name in _ARRAYS:
            setattr(self, name, np.append(getattr(self, name), 0.0))
        self.running[slot] = self.waiting[slot] = self.kv_usage[slot] = np.nan
        self.last_scrape[slot] = np.nan
        self.tps[slot] = prefill_tps or self.default_prefill_tps
        self._view = None
        return slot

    def remove_instance(self, instance_id: str) -> None:
        """Mark down and forget its cache; in-flight requests may still finish."""
        slot = self.slot_of(instance_id)
        self.health[slot] = Health.DOWN
        self.kv.clear(slot)
        self.kv_version += 1

    def set_health(self, instance_id: str, health: Health) -> None:
        self.health[self.slot_of(instance_id)] = health

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
        if features.request_id in self._requests:
            raise ValueError(f"request {features.request_id!r} is already in flight")
        slot = self.slot_of(instance_id)
        if cached_tokens is None:
            cached_tokens = int(self.view().cached_tokens(features)[slot])
        uncached = max(features.prompt_tokens - cached_tokens, 0)
        self.pending[slot] += uncached
        self.in_flight[slot] += 1
        self._requests[features.request_id] = _InFlight(
            slot, uncached, features.prompt_tokens, now, float(self.pending[slot])
        )
        self.kv.insert(slot, features.block_hashes)
        if self.global_tier is not None:
            self.global_tier.insert(features.block_hashes)
        self.kv_version += 1
        return uncached

    def on_first_token(self, request_id: str, now: float) -> None:
        """First token seen: its prefill is done, it joins the decode batch."""
        record = self._record(request_id)
        if record.started:
            return
        record.started = True
        slot = record.slot
        self.pending[slot] -= record.uncached_tokens
        self.batch[slot] += 1
        self.context[slot] += record.prompt_tokens
        self.decode_blocks[slot] += self._blocks_of(record.prompt_tokens)
        self._update_prefill_tps(slot, record.work_ahead, now - record.dispatch_time)

    def on_finish(self, request_id: str, now: float) -> None:
        """Request ended normally; everything it added is removed."""
        record = self._requests.pop(request_id, None)
        if record is None:
            raise UnknownRequestError(request_id)
        slot = record.slot
        if record.started:
            self.batch[slot] -= 1
            self.context[slot] -= record.prompt_tokens
            self.decode_blocks[slot] -= self._blocks_of(record.prompt_tokens)
        else:
            self.pending[slot] -= record.uncached_tokens
        self.in_flight[slot] -= 1

    def on_error(self, request_id: str, now: float) -> None:
        """Request failed or was aborted (connect error, 5xx, client cancel)."""
        self.on_finish(request_id, now)
        self.error_count += 1

    def is_in_flight(self, request_id: str) -> bool:
        return request_id in self._requests

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
    ) -> None:
        """Values parsed from the instance's /metrics (vllm:num_requests_running, ...)."""
        slot = self.slot_of(instance_id)
        if running is not None:
            self.running[slot] = running
        if waiting is not None:
            self.waiting[slot] = waiting
        if kv_usage is not None:
            self.kv_usage[slot] = kv_usage
        if capacity_blocks is not None and capacity_blocks > 0:
            self.kv.set_capacity(slot, capacity_blocks)
            self.kv_version += 1
        self.last_scrape[slot] = now

    def on_kv_event(self, instance_id: str, event: KVEvent, now: float) -> None:
        self.kv.apply_event(self.slot_of(instance_id), event)
        self.kv_version += 1

    def on_kv_event_batch(self, instance_id: str, batch: KVEventBatch, now: float) -> None:
        slot = self.slot_of(instance_id)
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
            batch_size=float(self.batch[slot]),
            in_flight=float(self.in_flight[slot]),
            decode_context_tokens=float(self.context[slot]),
            scraped_running=_optional(self.running[slot]),
            scraped_waiting=_optional(self.waiting[slot]),
            kv_usage=_optional(self.kv_usage[slot]),
            prefill_tps=float(self.tps[slot]),
            cached_blocks=self.kv.held_count(slot),
            last_scrape=_optional(self.last_scrape[slot]),
        )

    def _blocks_of(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def _record(self, request_id: str) -> _InFlight:
        try:
            return self._requests[request_id]
        except KeyError:
            raise UnknownRequestError(request_id) from None

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

    Arrays: ``pending_prefill``, ``in_flight``, ``decode_context_tokens``,
    ``decode_blocks`` (Σ per decoding request of its prompt blocks),
    ``prefill_tps``, ``kv_usage`` (nan = never scraped), ``health``;
    ``batch_size`` is computed per call (scrape correction). ``eligible`` is
    a fresh bool mask of healthy slots. ``ids[slot]`` is the instance id.
    """

    def __init__(self, state: ClusterState) -> None:
        self._state = state
        self.ids: tuple[str, ...] = tuple(state.ids)
        self.block_size = state.block_size
        self.pending_prefill = _readonly(state.pending)
        self.in_flight = _readonly(state.in_flight)
        self.decode_context_tokens = _readonly(state.context)
        self.decode_blocks = _readonly(state.decode_blocks)
        self.prefill_tps = _readonly(state.tps)
        self.kv_usage = _readonly(state.kv_usage)
        self.health = _readonly(state.health)
        self._scraped_running = state.running
        empty = np.zeros(0, dtype=np.int64)
        self._memo: tuple[RequestFeatures | None, int, np.ndarray, np.ndarray] = (
            None, -1, empty, empty)

    @property
    def size(self) -> int:
        return len(self.ids)

    @property
    def eligible(self) -> np.ndarray:
        return self.health == _HEALTHY

    @property
    def batch_size(self) -> np.ndarray:
        local = self._state.batch
        if not self._state.use_scraped_load:
            return _readonly(local)
        return np.fmax(local, self._scraped_running)  # fmax ignores nan (never scraped)

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
        memo = self._memo = (features, version, _readonly(blocks), _readonly(tokens))
        return memo

    def new_tokens(self, features: RequestFeatures) -> np.ndarray:
        """Prompt tokens each instance would have to prefill."""
        return features.prompt_tokens - self.cached_tokens(features)

    def p_tokens(self, features: RequestFeatures) -> np.ndarray:
        return self.pending_prefill + self.new_tokens(features)

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
        """Seconds until r's first token on each instance: P-token / prefill throughput.

        With ``tier_token_cost`` (cost of loading one token from the global
        tier relative to recomputing it) tier-held tokens beyond the local hit
        are charged at that fraction instead of full recompute.
        """
        work = self.p_tokens(features)
        if tier_token_cost is not None and self.has_global_tier:
            from_tier = np.maximum(
                self.global_tier_tokens(features) - self.cached_tokens(features), 0
            )
            work = work - from_tier * (1.0 - tier_token_cost)
        return work / self.prefill_tps
