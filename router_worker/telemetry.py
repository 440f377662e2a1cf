"""Telemetry out: state snapshots, per-arm metrics and events to Redis.

Where each lands and for how long: docs/architecture.md, "Where state lives".

Follows :mod:`router_worker.contract.telemetry` exactly. Routing never waits on Redis:
requests only append to in-memory aggregates and a bounded event buffer; one background
task writes every ``STATE_INTERVAL_S``. While Redis is unreachable, events and metrics
records stay buffered (bounded; the oldest are dropped and counted) and are flushed on
reconnect, followed by an ``events_dropped`` event carrying the count. Sampled routing
decisions (for the live view) are kept in a smaller buffer of the newest ones: they are a
window onto recent traffic, so an outage only costs the oldest of them (counted apart from
events, in ``decisions_dropped``).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from router_worker.capture import CAPTURE_BUFFER, CAPTURE_BUFFER_BLOCKS, CaptureBuffer
from router_worker.contract import telemetry as contract

log = logging.getLogger("router_worker.telemetry")

EVENT_BUFFER = 10_000
METRICS_BUFFER = 600
WINDOW_S = 30.0
WINDOW_MAX_SAMPLES = 50_000
FLUSH_BATCH = 500
DECISION_BUFFER = 100


@dataclass(slots=True)
class RequestSample:
    """One finished request as the router saw it."""

    at: float  # unix seconds
    arm: str
    policy: str
    instance: str | None
    ok: bool  # False only for failures on the serving side (5xx, mid-stream failures):
    # a client's bad request or disconnect says nothing about the policy or the engines.
    ttft: float | None
    tpot: float | None
    output_tokens: int
    prompt_tokens: int
    cached_tokens: int
    fallback: bool


class _Reservoir:
    """Uniform sample of at most ``size`` values (Vitter's algorithm R)."""

    def __init__(self, size: int, rng: random.Random) -> None:
        self.size, self.rng, self.seen = size, rng, 0
        self.values: list[float] = []

    def add(self, value: float) -> None:
        self.seen += 1
        if len(self.values) < self.size:
            self.values.append(value)
        else:
            # random() is one C call; randrange is several Python ones, four times per
            # request. Uniform over [0, seen) to within 2**-53.
            slot = int(self.rng.random() * self.seen)
            if slot < self.size:
                self.values[slot] = value


class _Window:
    """The requests of the last WINDOW_S seconds (the newest ``size`` at most) as numpy
    columns. The state snapshot reads the window four times a second, per arm and in all:
    as a deque of samples, its passes over some 20 000 of them held the event loop for
    ~10 ms each time. A request costs the hot path one list append; the samples move to
    the columns in batches (at the latest when the window is read)."""

    FIELDS = ("at", "ttft", "tpot", "output_tokens", "prompt_tokens", "cached_tokens")

    def __init__(self, size: int, batch: int = 1024) -> None:
        self.size, self.batch = size, batch
        # Room for two windows: the window is [start, end); when a batch no longer fits
        # behind it, its newest rows move to the front (one copy per ``size`` requests).
        self.columns = np.empty((len(self.FIELDS), 2 * size))  # ttft/tpot NaN: none
        self.ok = np.empty(2 * size, dtype=bool)
        self.arms = np.empty(2 * size, dtype=np.int32)
        self.arm_ids: dict[str, int] = {}
        self.start = self.end = 0
        self.pending: list[RequestSample] = []

    def add(self, sample: RequestSample) -> None:
        self.pending.append(sample)
        if len(self.pending) >= self.batch:
            self._fold()

    def stats(self, now: float, arm: str | None) -> contract.WindowStats:
        """Stats of the window (of one arm's requests in it) as of ``now``."""
        self._fold()
        recent = self.columns[0, self.start : self.end] >= now - WINDOW_S
        # The oldest requests leave from the front, up to the first recent one.
        self.start += int(np.argmax(recent)) if recent.any() else len(recent)
        rows = slice(self.start, self.end)
        columns, ok = self.columns[:, rows], self.ok[rows]
        if arm is not None:
            mine = self.arms[rows] == self.arm_ids.get(arm, -1)
            columns, ok = columns[:, mine], ok[mine]
        return _window_stats(columns, ok)

    def _fold(self) -> None:
        samples, self.pending = self.pending[-self.size :], []
        count = len(samples)
        if not count:
            return
        if self.end + count > len(self.ok):
            keep = min(self.end - self.start, self.size - count)
            for column in (self.columns.T, self.ok, self.arms):
                column[:keep] = column[self.end - keep : self.end]
            self.start, self.end = 0, keep
        nan = float("nan")
        rows = slice(self.end, self.end + count)
        self.columns[:, rows] = np.array(
            [
                (
                    s.at,
                    nan if s.ttft is None else s.ttft,
                    nan if s.tpot is None else s.tpot,
                    s.output_tokens,
                    s.prompt_tokens,
                    s.cached_tokens,
                )
                for s in samples
            ],
            dtype=np.float64,
        ).T
        self.ok[rows] = [s.ok for s in samples]
        ids = self.arm_ids
        self.arms[rows] = [ids.setdefault(s.arm, len(ids)) for s in samples]
        self.end += count
        self.start = max(self.start, self.end - self.size)


class _Counts:
    """Per-arm or per-instance counters and TTFT/TPOT reservoirs of one interval (plain
    ints: updated per request, turned into the contract's pydantic models once per
    record; a reservoir exists once a value came)."""

    __slots__ = ("errors", "fallbacks", "output_tokens", "requests", "tpot", "ttft")

    def __init__(self) -> None:
        self.requests = self.errors = self.output_tokens = self.fallbacks = 0
        self.ttft: _Reservoir | None = None
        self.tpot: _Reservoir | None = None

    def add(self, s: RequestSample, rng: random.Random) -> None:
        self.requests += 1
        self.errors += not s.ok
        self.output_tokens += s.output_tokens
        self.fallbacks += s.fallback
        if s.ttft is not None:
            self.ttft = _sampled(self.ttft, s.ttft, rng)
        if s.tpot is not None:
            self.tpot = _sampled(self.tpot, s.tpot, rng)

    def samples(self, target: contract.ArmMetrics | contract.InstanceMetrics) -> None:
        """Put the reservoirs' samples on ``target`` (its ``ttft_s``, ``tpot_s``)."""
        if self.ttft is not None:
            target.ttft_s = self.ttft.values
        if self.tpot is not None:
            target.tpot_s = self.tpot.values


def _sampled(reservoir: _Reservoir | None, value: float, rng: random.Random) -> _Reservoir:
    """``reservoir`` (a new one if None) with ``value`` offered to it."""
    if reservoir is None:
        reservoir = _Reservoir(contract.MAX_SAMPLES_PER_RECORD, rng)
    reservoir.add(value)
    return reservoir


class _Interval:
    """Aggregates of one metrics record (reset every METRICS_INTERVAL_S)."""

    def __init__(self, start: float, rng: random.Random) -> None:
        self.start = start
        self.rng = rng
        self.arms: dict[str, tuple[str, _Counts]] = {}  # arm -> (policy, counts)
        self.instances: dict[str, _Counts] = {}

    def add(self, s: RequestSample) -> None:
        arm = self.arms.get(s.arm)
        if arm is None:
            arm = self.arms[s.arm] = (s.policy, _Counts())
        arm[1].add(s, self.rng)
        if s.instance is not None:
            counts = self.instances.get(s.instance)
            if counts is None:
                counts = self.instances[s.instance] = _Counts()
            counts.add(s, self.rng)

    def record(
        self, cluster: str, router: str, end: float, peaks: dict[str, tuple[float, float, float]]
    ) -> contract.MetricsRecord:
        arms = {
            name: contract.ArmMetrics(
                policy=policy,
                requests=c.requests,
                errors=c.errors,
                output_tokens=c.output_tokens,
                hotspot_fallbacks=c.fallbacks,
            )
            for name, (policy, c) in self.arms.items()
        }
        instances = {
            name: contract.InstanceMetrics(
                requests=c.requests, errors=c.errors, output_tokens=c.output_tokens
            )
            for name, c in self.instances.items()
        }
        for name, (_, c) in self.arms.items():
            c.samples(arms[name])
        for name, c in self.instances.items():
            c.samples(instances[name])
        for name, (pending, batch, kv) in peaks.items():
            inst = instances.setdefault(name, contract.InstanceMetrics())
            inst.pending_prefill_tokens_max = pending
            inst.batch_size_max = batch
            inst.kv_usage_max = kv
        return contract.MetricsRecord(
            id=_new_id(),
            cluster=cluster,
            router=router,
            start=self.start,
            end=end,
            arms=arms,
            instances=instances,
        )


def _new_id() -> str:
    import uuid

    return uuid.uuid4().hex


SnapshotSource = Callable[[], dict[str, Any]]


class Telemetry:
    """In-memory aggregates plus the Redis writer task (when a Redis URL is given)."""

    def __init__(
        self, router: str, redis_url: str | None, on_dropped: Callable[[int], None] | None = None
    ) -> None:
        self.router = router
        self.cluster = "default"
        self.redis_url = redis_url
        self.on_dropped = on_dropped
        self.snapshot_source: SnapshotSource | None = None
        self.peaks_source: Callable[[], dict[str, tuple[float, float, float]]] | None = None
        self.max_model_len_source: Callable[[], int | None] | None = None
        self._rng = random.Random()
        self._window = _Window(WINDOW_MAX_SAMPLES)
        self._interval = _Interval(time.time(), self._rng)
        self._events: deque[contract.EventRecord] = deque()
        self._records: deque[contract.MetricsRecord] = deque()
        self._decisions: deque[contract.DecisionRecord] = deque()
        self.capture = CaptureBuffer()  # the traffic capture's requests, not yet digested
        self._captured: deque[contract.CaptureBatch] = deque()  # digested, not yet written
        self.decisions_dropped = 0
        self.dropped_total = 0
        self._dropped_unreported = 0
        self.connected: bool | None = None
        self._redis: Any = None
        self.recent_events: deque[dict[str, Any]] = deque(maxlen=200)

    # ----- producers (hot path: append only) ------------------------------------------
    def record(self, sample: RequestSample) -> None:
        self._window.add(sample)
        self._interval.add(sample)

    def event(self, kind: contract.EventKind, **payload: Any) -> contract.EventRecord:
        event = contract.EventRecord.new(self.cluster, self.router, kind, time.time(), **payload)
        self.recent_events.append(event.model_dump())
        if len(self._events) >= EVENT_BUFFER:
            self._events.popleft()
            self._count_dropped(1)
        self._events.append(event)
        return event

    def decision(self, record: contract.DecisionRecord) -> None:
        """Queue a sampled routing decision for the cluster's decision stream."""
        if len(self._decisions) >= DECISION_BUFFER:
            self._decisions.popleft()
            self.decisions_dropped += 1
        self._decisions.append(record)

    def _count_dropped(self, count: int) -> None:
        self.dropped_total += count
        self._dropped_unreported += count
        if self.on_dropped is not None:
            self.on_dropped(count)

    # ----- aggregation --------------------------------------------------------------
    def window_stats(self, now: float, arm: str | None = None) -> contract.WindowStats:
        return self._window.stats(now, arm)

    def state_snapshot(self, now: float) -> contract.StateSnapshot:
        source = self.snapshot_source() if self.snapshot_source else {}
        arms = {name: self.window_stats(now, name) for name in source.get("arms", ())}
        window = self.window_stats(now)
        window.load_cv = source.get("load_cv")
        return contract.StateSnapshot(
            ts=now,
            cluster=self.cluster,
            router=self.router,
            config_version=source.get("config_version"),
            policy=source.get("policy", ""),
            instances=source.get("instances", []),
            window=window,
            arms=arms,
            hotspots=source.get("hotspots", []),
            tenants=source.get("tenants", {}),
            disaggregation=source.get("disaggregation"),
        )

    def cut_metrics_record(self, now: float) -> None:
        peaks = self.peaks_source() if self.peaks_source else {}
        record = self._interval.record(self.cluster, self.router, now, peaks)
        self._interval = _Interval(now, self._rng)
        if len(self._records) >= METRICS_BUFFER:
            self._records.popleft()
            self._count_dropped(1)
        self._records.append(record)

    # ----- the writer ---------------------------------------------------------------
    async def run(self) -> None:
        """Write state every STATE_INTERVAL_S, metrics every METRICS_INTERVAL_S; forever."""
        next_metrics = time.time() + contract.METRICS_INTERVAL_S
        while True:
            await asyncio.sleep(contract.STATE_INTERVAL_S)
            now = time.time()
            if now >= next_metrics:
                self.cut_metrics_record(now)
                next_metrics = now + contract.METRICS_INTERVAL_S
            if self.redis_url is None:
                self._records.clear()
                self._events.clear()
                self._decisions.clear()
                self.capture.clear()
                continue
            await self._write(now)

    async def _write(self, now: float) -> None:
        try:
            redis = self._client()
            await redis.set(
                contract.state_key(self.cluster, self.router),
                contract.dumps_state(self.state_snapshot(now)),
                ex=contract.STATE_TTL_S,
            )
            await self._flush(redis)
            self._set_connected(True)
        except Exception as error:  # Redis down or misbehaving: keep routing, retry later
            self._set_connected(False, error)

    async def _flush(self, redis: Any) -> None:
        if self._dropped_unreported:
            count, self._dropped_unreported = self._dropped_unreported, 0
            self.event("events_dropped", count=count)
        await self._flush_queue(redis, self._events, contract.events_stream)
        await self._flush_queue(redis, self._records, self._own_metrics_stream)
        await self._flush_decisions(redis)
        await self._flush_capture(redis)

    def _own_metrics_stream(self, cluster: str) -> str:
        return contract.router_metrics_stream(cluster, self.router)

    async def _flush_capture(self, redis: Any) -> None:
        """Captured requests, digested here (off the request path), to the capture stream;
        while Redis is down the newest `CAPTURE_BUFFER` requests (of `CAPTURE_BUFFER_BLOCKS`
        blocks at most) wait, the rest are counted in ``capture.dropped``."""
        context = self.max_model_len_source() if self.max_model_len_source else None
        self._captured.extend(self.capture.drain(self.cluster, self.router, context))
        waiting = sum(len(batch.requests) for batch in self._captured)
        blocks = sum(_batch_blocks(batch) for batch in self._captured)
        while waiting > CAPTURE_BUFFER or blocks > CAPTURE_BUFFER_BLOCKS:
            oldest = self._captured.popleft()
            waiting -= len(oldest.requests)
            blocks -= _batch_blocks(oldest)
            self.capture.dropped += len(oldest.requests)
        await self._flush_queue(redis, self._captured, contract.capture_stream)

    async def _flush_queue(
        self, redis: Any, queue: deque[Any], stream_of: Callable[[str], str]
    ) -> None:
        """Each item to its cluster's stream (the only one this router may write)."""
        while queue:
            batch = [queue[i] for i in range(min(FLUSH_BATCH, len(queue)))]
            pipe = redis.pipeline(transaction=False)
            for item in batch:
                pipe.xadd(
                    stream_of(item.cluster),
                    item.to_stream_fields(),
                    maxlen=contract.STREAM_MAXLEN,
                    approximate=True,
                )
            await pipe.execute()
            for _ in batch:  # only what Redis accepted leaves the buffer
                queue.popleft()

    async def _flush_decisions(self, redis: Any) -> None:
        """Each cluster's stream is capped and expires once its routers stop writing."""
        if not self._decisions:
            return
        batch = list(self._decisions)
        self._decisions.clear()  # taken out first: requests may add more during the write
        pipe = redis.pipeline(transaction=False)
        for record in batch:
            pipe.xadd(
                contract.decisions_stream(record.cluster),
                record.to_stream_fields(),
                maxlen=contract.DECISIONS_STREAM_MAXLEN,
                approximate=True,
            )
        for cluster in {record.cluster for record in batch}:
            pipe.expire(contract.decisions_stream(cluster), contract.DECISIONS_STREAM_TTL_S)
        try:
            await pipe.execute()
        except Exception:  # not written: back before the newer ones, the newest kept
            self._decisions.extendleft(reversed(batch))
            while len(self._decisions) > DECISION_BUFFER:
                self._decisions.popleft()
                self.decisions_dropped += 1
            raise

    def _client(self) -> Any:
        if self._redis is None:
            import redis.asyncio as aioredis

            assert self.redis_url is not None, "only called with Redis configured"
            self._redis = aioredis.Redis.from_url(
                self.redis_url, socket_timeout=0.5, socket_connect_timeout=0.5
            )
        return self._redis

    def _set_connected(self, connected: bool, error: Exception | None = None) -> None:
        if connected != self.connected:
            if connected:
                log.info("telemetry: Redis reachable")
            else:
                log.warning("telemetry: Redis unreachable (%s); buffering", error)
        self.connected = connected

    @property
    def buffered_events(self) -> int:
        return len(self._events)

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()


def _window_stats(columns: np.ndarray, ok: np.ndarray) -> contract.WindowStats:
    """The stats of the window's requests, given as :class:`_Window` columns."""
    at, ttft, tpot, output_tokens, prompt_tokens, cached_tokens = columns
    requests = len(at)
    span = max(min(WINDOW_S, at[-1] - at[0]), 1.0) if requests else WINDOW_S
    prompt = int(prompt_tokens.sum())
    ttft_p50, ttft_p99 = _p50_p99(ttft)
    tpot_p50, tpot_p99 = _p50_p99(tpot)
    return contract.WindowStats(
        seconds=WINDOW_S,
        requests=requests,
        errors=requests - int(np.count_nonzero(ok)),
        requests_per_s=requests / span,
        output_tokens_per_s=int(output_tokens.sum()) / span,
        ttft_p50_s=ttft_p50,
        ttft_p99_s=ttft_p99,
        tpot_p50_s=tpot_p50,
        tpot_p99_s=tpot_p99,
        hit_ratio=int(cached_tokens.sum()) / prompt if prompt else None,
    )


def _p50_p99(column: np.ndarray) -> tuple[float | None, float | None]:
    """Median and 99th percentile of the known values (NaN: none, as for a request that
    failed before its first token); numpy's linear interpolation, as
    ``engine_interface.percentile``, but both from one partition of the column."""
    known = column[~np.isnan(column)]
    if not known.size:
        return None, None
    p50, p99 = np.percentile(known, (50, 99))
    return float(p50), float(p99)


def _batch_blocks(batch: contract.CaptureBatch) -> int:
    """A digested batch's blocks (8 bytes each, as base64 of 4 characters per 3 bytes)."""
    return sum(len(request.block_hashes) * 3 // 32 for request in batch.requests)
