"""The telemetry publisher: routers' state in Redis → one coalesced snapshot per cluster per
tick → the cluster's Channels group; router events and config notifications are forwarded
at once as separate messages (never coalesced).

One asyncio process serves every cluster (`manage.py run_publisher`). Snapshots: each poll
(every `poll_s`) MGETs the known state keys of every cluster in one pipeline; a cluster's
snapshot is sent when some router wrote a newer one and at least `interval_s` passed since
the last send, so browsers get at most one snapshot per tick. Once a tick has passed, it
goes out at the first poll that sees a fresh router write (or after two ticks at most):
sends lock onto writes, so what is sent is at most one poll old. Keys are rediscovered
with SCAN every `scan_s`.
Events: XREAD on the events streams (each cluster's, and the one shared by all) with the
publisher's own cursors (not the ingest consumer group). Config: the `switchyard:config`
pub/sub channel. Sampled routing decisions: XREAD on every cluster's decision stream, at
most once per tick, so each cluster's dashboards get at most one `decisions` message per
tick (newest first, at most `DECISIONS_SHOWN`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, cast

import redis.asyncio as aioredis
from asgiref.sync import sync_to_async
from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError
from redis.exceptions import RedisError, ResponseError

from controlplane.services import ingest
from router_worker.contract.telemetry import (
    CONFIG_CHANNEL,
    EVENTS_STREAM,
    EventRecord,
    decisions_stream,
    events_stream,
    state_pattern,
)

from . import records
from .snapshot import merge_cluster
from .state import (
    DECISIONS_SHOWN,
    RawState,
    Rejected,
    StreamEntry,
    group_name,
    parse_decisions,
    parse_state,
    queue_state_reads,
    scan_state_keys,
)

log = logging.getLogger(__name__)

# Router event kinds forwarded to dashboards (the rest only matter to ingest).
FORWARDED_EVENTS = frozenset(
    {"hotspot", "health", "config_applied", "config_rejected", "router_started", "router_restarted"}
)
MESSAGE_TYPE = "cluster.message"  # handled by ClusterLiveConsumer.cluster_message
RETRY_S = 1.0

Send = Callable[[str, dict[str, Any]], Awaitable[None]]


@dataclass
class ClusterFeed:
    """Per-cluster publishing state."""

    cluster_id: int
    name: str
    keys: list[bytes] = field(default_factory=list)
    seen: tuple[tuple[str, float], ...] = ()  # router timestamps of the last send
    polled: tuple[tuple[str, float], ...] = ()  # router timestamps at the last poll
    last_sent: float = 0.0
    decisions_cursor: bytes | str | None = None  # last decision-stream entry forwarded
    events_cursor: bytes | str | None = None  # last entry forwarded of its events stream
    # state key -> hash of the malformed value last counted there: a bad value is counted
    # (and parsed) once, not at every poll while it stays
    rejected: dict[bytes, int] = field(default_factory=dict)


@dataclass
class PublisherSettings:
    interval_s: float = 0.25
    poll_s: float = 0.025
    scan_s: float = 1.0
    clusters_s: float = 5.0


def event_message(event: EventRecord, cluster_id: int) -> dict[str, Any]:
    return {
        "type": "event",
        "kind": event.kind,
        "cluster_id": cluster_id,
        "event": event.model_dump(),
    }


def decisions_message(decisions: list[dict[str, Any]], cluster_id: int) -> dict[str, Any]:
    """Newest first, as the live view lists them."""
    return {"type": "decisions", "cluster_id": cluster_id, "decisions": decisions}


def config_message(payload: dict[str, Any], cluster_id: int) -> dict[str, Any]:
    return {
        "type": "config",
        "cluster": payload.get("cluster"),
        "cluster_id": cluster_id,
        "version": payload.get("version"),
        "at": time.time(),
    }


def _load_clusters() -> dict[str, int]:
    from controlplane.models import Cluster

    return dict(Cluster.objects.values_list("name", "pk"))


class Publisher:
    def __init__(
        self,
        client: aioredis.Redis,
        send: Send,
        settings: PublisherSettings | None = None,
        load_clusters: Callable[[], dict[str, int]] = _load_clusters,
    ) -> None:
        self.client = client
        self.send = send
        self.settings = settings or PublisherSettings()
        self.load_clusters = load_clusters
        self.feeds: dict[str, ClusterFeed] = {}
        self.cursor: bytes | str | None = None  # last events-stream entry forwarded
        self.loop_errors = 0  # unexpected errors a loop survived (each logged)
        self.rejected = 0  # malformed records counted in the quarantine
        self.unreadable_streams: dict[str, str] = {}  # stream -> Redis's refusal (WRONGTYPE)

    async def run(self, stop: asyncio.Event) -> None:
        loops = [
            self._forever(stop, self.refresh_clusters, self.settings.clusters_s),
            self._forever(stop, self.refresh_keys, self.settings.scan_s),
            self._forever(stop, self.publish_snapshots, self.settings.poll_s),
            self._forever(stop, self._events_loop, 0),
            self._forever(stop, self.forward_decisions, self.settings.interval_s),
            self._forever(stop, self._config_loop, 0),
        ]
        await self.refresh_clusters()
        await asyncio.gather(*loops)

    async def _forever(
        self, stop: asyncio.Event, step: Callable[[], Awaitable[Any]], period: float
    ) -> None:
        while not stop.is_set():
            try:
                await step()
            except (RedisError, OSError) as error:
                log.warning("%s: %s; retrying", step.__name__, error)
                await _sleep_or_stop(stop, RETRY_S)
                continue
            except Exception:  # a bug must not end the loop for every cluster
                self.loop_errors += 1
                log.exception("%s failed; retrying", step.__name__)
                await _sleep_or_stop(stop, RETRY_S)
                continue
            if period:
                await _sleep_or_stop(stop, period)

    async def refresh_clusters(self) -> None:
        names = await sync_to_async(self.load_clusters, thread_sensitive=False)()
        for name, cluster_id in names.items():
            if name not in self.feeds:
                self.feeds[name] = ClusterFeed(cluster_id, name)
        for gone in set(self.feeds) - set(names):
            del self.feeds[gone]

    async def refresh_keys(self) -> None:
        for feed in list(self.feeds.values()):
            feed.keys = await scan_state_keys(self.client, feed.name)

    async def publish_snapshots(self) -> None:
        feeds = [f for f in self.feeds.values() if f.keys or f.seen]
        if not feeds:
            return
        # refresh_keys may replace a feed's keys while this poll awaits Redis
        keys = [list(feed.keys) for feed in feeds]
        async with self.client.pipeline(transaction=False) as pipe:
            for feed_keys in keys:
                queue_state_reads(pipe, feed_keys)
            results = await pipe.execute(raise_on_error=False)
        start = 0
        for feed, feed_keys in zip(feeds, keys, strict=True):
            raws = results[start : start + len(feed_keys)]
            start += len(feed_keys)
            await self._maybe_send(feed, feed_keys, raws)

    async def _parse_states(
        self, feed: ClusterFeed, keys: list[bytes], raws: list[RawState]
    ) -> list:
        """The feed's valid snapshots; a malformed value is quarantined once per value."""
        snapshots, rejected = [], []
        for key, raw in zip(keys, raws, strict=True):
            digest = hash(raw if isinstance(raw, bytes | str | None) else str(raw))
            if feed.rejected.get(key) == digest:
                continue
            try:
                snapshot = parse_state(raw)
            except records.BadRecord as error:
                feed.rejected[key] = digest
                data = raw if isinstance(raw, bytes) else b""
                rejected.append(Rejected(state_pattern(feed.name), _text(key), data, str(error)))
                continue
            feed.rejected.pop(key, None)
            if snapshot is not None:
                snapshots.append(snapshot)
        for key in set(feed.rejected) - set(keys):
            del feed.rejected[key]
        await self.quarantine(rejected)
        return snapshots

    async def _maybe_send(self, feed: ClusterFeed, keys: list[bytes], raws: list[RawState]) -> None:
        snapshots = await self._parse_states(feed, keys, raws)
        seen = tuple(sorted((s.router, s.ts) for s in snapshots))
        fresh, feed.polled = seen != feed.polled, seen  # a router wrote since the last poll
        now = time.time()
        if not self._due(feed, seen, fresh, now - feed.last_sent):
            return
        feed.seen, feed.last_sent = seen, now
        message = merge_cluster(feed.name, snapshots, cluster_id=feed.cluster_id)
        message["published_at"] = now
        await self.send(group_name(feed.cluster_id), message)

    def _due(self, feed: ClusterFeed, seen: tuple, fresh: bool, since_last: float) -> bool:
        """Send changed state once per tick, right after a router writes (so what is sent is
        at most one poll old); a tick of two intervals without a fresh write sends anyway."""
        if seen == feed.seen or since_last < self.settings.interval_s:
            return False
        return fresh or since_last >= 2 * self.settings.interval_s

    async def _events_loop(self) -> None:
        """The stream shared by every cluster and each cluster's own (where an event of
        another cluster is skipped: routers writing there speak for theirs only)."""
        if self.cursor is None:
            self.cursor = await self._stream_tail()
        while True:
            feeds = {events_stream(feed.name): feed for feed in list(self.feeds.values())}
            cursors = {EVENTS_STREAM: self.cursor}
            for stream, feed in feeds.items():
                if feed.events_cursor is None:
                    feed.events_cursor = await self._stream_tail(stream)
                cursors[stream] = feed.events_cursor
            batches = await self._xread(cursors, count=200, block=1000)
            for stream, entries in batches or []:
                own = feeds.get(stream.decode() if isinstance(stream, bytes) else stream)
                for entry_id, fields in entries:
                    if own is None:
                        self.cursor = entry_id
                    else:
                        own.events_cursor = entry_id
                    await self.forward_event(fields, None if own is None else own.name)

    async def _xread(self, cursors: dict[str, Any], count: int, block: int) -> list[Any]:
        """One XREAD of every stream; when a key of another type sits where a stream belongs
        (WRONGTYPE fails the whole read), each stream is read on its own and the unreadable
        ones are skipped (counted in ``unreadable_streams``), so every other cluster's
        records still flow."""
        try:
            # redis-py asks for an invariant dict[KeyT, StreamIdT] (a str key is one); the
            # reply is RESP2's [[stream, entries], ...] (its type also admits RESP3's)
            reply = await self.client.xread(cursors, count=count, block=block)  # type: ignore[arg-type]
            return cast("list[Any]", reply or [])
        except ResponseError as error:
            if "WRONGTYPE" not in str(error):
                raise
        batches: list[Any] = []
        for stream, cursor in cursors.items():
            try:
                batches += await self.client.xread({stream: cursor}, count=count) or []
            except ResponseError as error:
                self.unreadable_streams[stream] = str(error)[:200]
                log.warning("cannot read %s: %s", stream, error)
        if not batches:  # nothing readable arrived: pace the retry as the blocking read did
            await asyncio.sleep(block / 1000)
        return batches

    async def _stream_tail(self, stream: str = EVENTS_STREAM) -> bytes | str:
        try:
            last = cast("list[StreamEntry]", await self.client.xrevrange(stream, count=1))
        except ResponseError as error:  # not a stream: _xread skips it while it is not
            self.unreadable_streams[stream] = str(error)[:200]
            return "0-0"
        return last[0][0] if last else "0-0"

    async def forward_decisions(self, block_ms: int = 1000) -> None:
        """One read of every cluster's new sampled decisions, one message per cluster."""
        feeds = {decisions_stream(feed.name): feed for feed in list(self.feeds.values())}
        if not feeds:
            return
        for stream, feed in feeds.items():
            if feed.decisions_cursor is None:  # a dashboard's first paint shows the past
                feed.decisions_cursor = await self._stream_tail(stream)
        batches = await self._xread(
            {stream: feed.decisions_cursor for stream, feed in feeds.items()},
            count=DECISIONS_SHOWN,
            block=block_ms,
        )
        for stream, entries in batches or []:
            name = stream.decode() if isinstance(stream, bytes) else stream
            feed = feeds[name]
            feed.decisions_cursor = entries[-1][0]
            rejected: list[Rejected] = []
            decisions = parse_decisions(list(reversed(entries)), rejected, name)
            await self.quarantine(rejected)
            if decisions:
                await self.send(
                    group_name(feed.cluster_id), decisions_message(decisions, feed.cluster_id)
                )

    async def forward_event(self, fields: dict, only: str | None = None) -> None:
        try:  # ingest quarantines and counts what is malformed: only skipped here
            event = records.parse(EventRecord, records.stream_data(fields))
        except records.BadRecord as error:
            log.warning("skipping malformed router event: %s", error)
            return
        feed = self.feeds.get(event.cluster)
        if only is not None and event.cluster != only:
            log.warning("skipping an event of %r in the stream of %r", event.cluster[:80], only)
        elif feed is not None and event.kind in FORWARDED_EVENTS:
            await self.send(group_name(feed.cluster_id), event_message(event, feed.cluster_id))

    async def _config_loop(self) -> None:
        async with self.client.pubsub() as pubsub:
            await pubsub.subscribe(CONFIG_CHANNEL)
            async for message in pubsub.listen():
                if message.get("type") == "message":
                    await self.forward_config(message["data"])

    async def forward_config(self, data: bytes | str) -> None:
        try:
            payload = ConfigNotice.model_validate(records.load_object(data))
        except (records.BadRecord, ValidationError) as error:
            raw = data if isinstance(data, bytes) else str(data).encode(errors="replace")
            reason = records.reason(error)
            await self.quarantine([Rejected(CONFIG_CHANNEL, "", raw, reason)])
            return
        feed = self.feeds.get(payload.cluster)
        if feed is None:  # a cluster created since the last refresh
            await self.refresh_clusters()
            feed = self.feeds.get(payload.cluster)
        if feed is not None:
            await self.send(
                group_name(feed.cluster_id), config_message(payload.model_dump(), feed.cluster_id)
            )

    async def quarantine(self, rejected: list[Rejected]) -> None:
        """Count and keep malformed records as ingest does (the quarantine page shows them);
        a Redis error here is the loop's (it retries)."""
        if not rejected:
            return
        self.rejected += len(rejected)
        for item in rejected:
            log.warning("%s %s quarantined: %s", item.source, item.entry_id, item.reason)
        for source in {item.source for item in rejected}:
            await self._repair_count(source)
        async with self.client.pipeline(transaction=True) as pipe:
            for item in rejected:
                ingest.queue_quarantine(pipe, item.source, item.entry_id, item.data, item.reason)
            await pipe.execute()

    async def _repair_count(self, source: str) -> None:
        """As ingest.repair_count: a forged count must not stop the counting."""
        try:
            raw = await self.client.hget(ingest.QUARANTINE_COUNTS, source)
            command = ingest.count_repair(source, raw, False)
        except ResponseError:  # WRONGTYPE
            command = ingest.count_repair(source, None, True)
        if command:
            await self.client.execute_command(*command)


class ConfigNotice(BaseModel):
    """What the control plane publishes on the config channel."""

    model_config = ConfigDict(extra="ignore")
    cluster: Annotated[str, BeforeValidator(lambda v: str(v) if isinstance(v, int) else v)]
    version: int


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def channel_layer_sender() -> Send:
    from channels.layers import get_channel_layer

    layer = get_channel_layer()

    async def send(group: str, message: dict[str, Any]) -> None:
        await layer.group_send(group, {"type": MESSAGE_TYPE, "message": message})

    return send


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
