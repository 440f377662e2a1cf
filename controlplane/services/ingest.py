"""Ingest of the routers' Redis streams into Postgres.

Events (hotspot transitions, health changes, config applied, restarts) and metrics records
are read through a Redis consumer group and acknowledged only after the database commit,
so an outage of Postgres leaves them pending in Redis and an outage of Redis loses nothing
that was already written there. Rows are keyed by the router-assigned id, so a re-delivered
entry is ignored: ingest is idempotent and resumable.

An entry Postgres cannot hold (malformed, an out-of-range time or number, a name longer than
its column, a cluster that does not exist) is quarantined instead of stored: copied with the
reason to the dead-letter stream ``QUARANTINE_STREAM``, counted per source stream in the hash
``QUARANTINE_COUNTS``, and acknowledged with the rest of its batch. Each entry is stored in its
own savepoint, so one refused row never takes its valid neighbours with it, and a poison entry
is never re-read. Errors of Postgres itself (unreachable, restarting) still abort the batch
unacknowledged, to be delivered again.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any, cast

import redis
from django.db import DataError, transaction
from pydantic import Field, ValidationError

from controlplane.models import (
    Cluster,
    HotspotEvent,
    IngestedRecord,
    RouterDeployment,
    RouterEvent,
)
from router_worker.contract.telemetry import (
    EVENTS_STREAM,
    METRICS_STREAM,
    ArmMetrics,
    EventRecord,
    HotspotPayload,
    InstanceMetrics,
    MetricsRecord,
    capture_stream,
    events_stream,
    metrics_stream,
    router_metrics_stream,
)

from . import audit, rollups
from .audit import Actor
from .entries import LATEST_UNIX, PoisonEntry, entry_bytes, raw_data, text
from .fields import INT_COLUMN, max_length

log = logging.getLogger(__name__)
GROUP = "controlplane-ingest"
CONSUMER = "ingest"
BATCH = 500

CAPTURE_STREAM_PREFIX = capture_stream("")
QUARANTINE_STREAM = "switchyard:quarantine"
QUARANTINE_COUNTS = "switchyard:quarantine:counts"  # hash: source stream -> entries, ever
QUARANTINE_MAXLEN = 1_000  # the newest entries stay inspectable; the counts never shrink
QUARANTINED_DATA_BYTES = 16_384
REASON_CHARS = 500
MAX_EVENT_BYTES = 1024 * 1024  # a router's events are a few hundred bytes
# A metrics record carries at most two samples per request it covers (a second's worth).
MAX_METRICS_BYTES = 8 * 1024 * 1024
# Capture ingest, per run of the task (every 2 s, 60 s soft limit): slices of ~4 MiB, each
# one transaction; at most 64 MiB or 20 s, over every cluster's stream.
CAPTURE_SLICE_BYTES = 4 * 1024 * 1024
CAPTURE_RUN_BYTES = 64 * 1024 * 1024
CAPTURE_RUN_S = 20.0


class StorableEvent(EventRecord):
    """The contract's event narrowed to what the Postgres rows can hold."""

    id: str = Field(min_length=1, max_length=max_length(RouterEvent, "event_id"))
    router: str = Field(max_length=max_length(RouterEvent, "router"))
    at: float = Field(ge=0, le=LATEST_UNIX)


class StorableHotspot(HotspotPayload):
    prefix_class: str = Field(max_length=max_length(HotspotEvent, "prefix_class"))
    prefix_hash: str = Field(max_length=max_length(HotspotEvent, "prefix_hash"))
    m: int = Field(ge=-INT_COLUMN, le=INT_COLUMN)
    m_bar: int = Field(ge=-INT_COLUMN, le=INT_COLUMN)


# A TTFT or TPOT beyond an hour is no measurement; a negative one (or NaN) never is, and a
# baseline median at or below zero would blind the canary judge.
LATENCY_BOUND_S = 3600.0
Latency = Annotated[float, Field(ge=0, le=LATENCY_BOUND_S)]
Count = Annotated[int, Field(ge=0, le=INT_COLUMN)]


class StorableArmMetrics(ArmMetrics):
    requests: Count = 0
    errors: Count = 0
    output_tokens: Count = 0
    hotspot_fallbacks: Count = 0
    ttft_s: list[Latency] = Field(default_factory=list)
    tpot_s: list[Latency] = Field(default_factory=list)


class StorableInstanceMetrics(InstanceMetrics):
    requests: Count = 0
    errors: Count = 0
    output_tokens: Count = 0
    ttft_s: list[Latency] = Field(default_factory=list)
    tpot_s: list[Latency] = Field(default_factory=list)


class StorableMetrics(MetricsRecord):
    id: str = Field(min_length=1, max_length=max_length(IngestedRecord, "record_id"))
    # pydantic re-validates a field re-declared narrower; mypy sees the dict as invariant
    arms: dict[str, StorableArmMetrics] = Field(default_factory=dict)  # type: ignore[assignment]
    instances: dict[str, StorableInstanceMetrics] = Field(default_factory=dict)  # type: ignore[assignment]
    start: float = Field(ge=0, le=LATEST_UNIX)
    end: float = Field(ge=0, le=LATEST_UNIX)


@dataclass
class IngestResult:
    read: int = 0
    stored: int = 0
    duplicates: int = 0
    quarantined: int = 0
    unreadable: list[str] = field(default_factory=list)  # streams Redis would not read


@dataclass(frozen=True)
class QuarantinedEntry:
    id: str
    source: str  # the stream it was read from
    entry_id: str  # its id there
    reason: str
    data: str  # as it was sent (cut at QUARANTINED_DATA_BYTES)
    data_bytes: int
    at: datetime


@dataclass(frozen=True)
class QuarantineSummary:
    counts: dict[str, int] = field(default_factory=dict)
    entries: list[QuarantinedEntry] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def ensure_group(client: redis.Redis, stream: str) -> None:
    try:
        client.xgroup_create(stream, GROUP, id="0", mkstream=True)
    except redis.ResponseError as error:
        if "BUSYGROUP" not in str(error):
            raise


def read_batch(client: redis.Redis, stream: str, count: int = BATCH) -> list[tuple[bytes, dict]]:
    """Own pending entries first (left unacknowledged by a failed run), then new ones."""
    ensure_group(client, stream)
    for start in ("0", ">"):
        # a RESP2 reply, [[stream, entries]] (redis-py's type also admits RESP3's dict)
        response = cast(
            "list[list[Any]]", client.xreadgroup(GROUP, CONSUMER, {stream: start}, count=count)
        )
        entries = response[0][1] if response else []
        if entries:
            return entries
    return []


def to_datetime(unix_seconds: float) -> datetime:
    return datetime.fromtimestamp(unix_seconds, tz=UTC)


def require_storable(value: Any, path: str = "") -> None:
    """Postgres refuses NaN and infinities in JSON and NUL characters in any text."""
    if isinstance(value, float) and not math.isfinite(value):
        raise PoisonEntry(f"{path or 'value'}: {value} is not a finite number")
    if isinstance(value, str) and "\x00" in value:
        raise PoisonEntry(f"{path or 'value'}: contains a NUL character")
    if isinstance(value, dict):
        for key, item in value.items():
            require_storable(key, path)
            require_storable(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            require_storable(item, f"{path}[{index}]")


def parse_event(fields: dict) -> EventRecord:
    size = len(raw_data(fields))
    if size > MAX_EVENT_BYTES:
        raise PoisonEntry(f"{size} bytes, more than {MAX_EVENT_BYTES}")
    event = StorableEvent.from_stream_fields(fields)
    if event.kind == "hotspot":
        StorableHotspot.model_validate(event.payload)
    require_storable(event.model_dump())
    return event


def parse_metrics(fields: dict) -> MetricsRecord:
    size = len(raw_data(fields))
    if size > MAX_METRICS_BYTES:
        raise PoisonEntry(f"{size} bytes, more than {MAX_METRICS_BYTES}")
    record = StorableMetrics.from_stream_fields(fields)
    require_storable(record.model_dump())
    return record


def _cluster_of(name: str, clusters: dict[str, Cluster]) -> Cluster:
    cluster = clusters.get(name)
    if cluster is None:
        raise PoisonEntry(f"unknown cluster {name[:80]!r}")
    return cluster


def store_event(event: EventRecord, clusters: dict[str, Cluster]) -> bool:
    """Insert one event; False when it was already stored."""
    cluster = _cluster_of(event.cluster, clusters)
    if event.kind == "hotspot":
        hotspot = HotspotPayload.model_validate(event.payload)
        _, created = HotspotEvent.objects.get_or_create(
            event_id=event.id,
            defaults={
                "cluster": cluster,
                "router": event.router,
                "at": to_datetime(event.at),
                "transition": hotspot.transition,
                "prefix_class": hotspot.prefix_class,
                "prefix_hash": hotspot.prefix_hash,
                "x": hotspot.x,
                "x_bar": hotspot.x_bar,
                "m": hotspot.m,
                "m_bar": hotspot.m_bar,
                "window": hotspot.window,
                "instances": hotspot.instances,
                "details": event.payload,
            },
        )
        return created
    _, created = RouterEvent.objects.get_or_create(
        event_id=event.id,
        defaults={
            "cluster": cluster,
            "router": event.router,
            "at": to_datetime(event.at),
            "kind": event.kind,
            "payload": event.payload,
        },
    )
    if created and event.kind == "flow_refusals":
        audit_refusals(event, cluster)
    return created


def audit_refusals(event: EventRecord, cluster: Cluster) -> None:
    """A router's summary of flow control's refusals (a minute's, per tenant and reason)
    as one audit row: sheds and quota refusals are seen in the audit without a row per
    request."""
    tenants = event.payload.get("tenants")
    if not isinstance(tenants, dict):
        raise PoisonEntry("flow_refusals without a tenants object")
    totals = {
        str(tenant): sum(n for n in reasons.values() if isinstance(n, int))
        for tenant, reasons in tenants.items()
        if isinstance(reasons, dict)
    }
    summary = ", ".join(f"{tenant}: {count}" for tenant, count in sorted(totals.items()))
    audit.record(
        Actor.system(f"router:{event.router}"),
        "flow.refusals",
        cluster,
        after=event.payload,
        reason=f"refused over {event.payload.get('interval_s', '?')} s: {summary}"[:1000],
        cluster=cluster,
    )


def store_metrics(record: MetricsRecord, clusters: dict[str, Cluster]) -> bool:
    """Fold one metrics record into the rollups; False when already folded."""
    cluster = _cluster_of(record.cluster, clusters)
    if not cluster.routers.filter(name=record.router).exists():
        # Only the cluster's own routers speak for its arms (the canary judge reads them).
        raise PoisonEntry(f"unknown router {record.router[:80]!r} of cluster {cluster.name!r}")
    _, created = IngestedRecord.objects.get_or_create(record_id=record.id)
    if created:
        rollups.fold(cluster, record)
    return created


# What an entry's content can raise while parsed or stored (pydantic's ValidationError is a
# ValueError; DataError: a value Postgres refuses). Anything else, OperationalError above
# all, is a fault of the system, not of the entry: the batch stays pending.
ENTRY_FAULTS = (ValueError, ArithmeticError, RecursionError, DataError)


def _reason(error: Exception) -> str:
    if isinstance(error, ValidationError):
        text = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'entry'}: {e['msg']}" for e in error.errors()
        )
    else:
        text = f"{type(error).__name__}: {error}"
    return text.strip()[:REASON_CHARS]


def _store_entry(
    fields: dict,
    parse: Callable[[dict], Any],
    store: Callable[[Any, dict[str, Cluster]], bool],
    clusters: dict[str, Cluster],
) -> bool | str:
    """True (stored), False (a duplicate) or the reason the entry is quarantined."""
    try:
        item = parse(fields)
        with transaction.atomic():  # a savepoint: a refused row undoes only this entry
            return store(item, clusters)
    except ENTRY_FAULTS as error:
        return _reason(error)


_BLOCK_HASHES = re.compile(rb'("block_hashes"\s*:\s*)"[^"]*("|$)')


def withhold_block_hashes(data: bytes) -> bytes:
    """A capture entry as the quarantine keeps it: every prompt's block hashes withheld
    (a router before keying sent them raw: a prompt's fingerprint, which a viewer of the
    quarantine could confirm a guessed prompt against); the rest as it was."""
    return _BLOCK_HASHES.sub(rb'\1"(withheld)"', data)


def _quarantine_fields(source: str, entry_id: bytes | str, data: bytes, reason: str) -> dict:
    if source.startswith(CAPTURE_STREAM_PREFIX):
        data = withhold_block_hashes(data)
    return {
        "source": source,
        "entry_id": entry_id,
        "reason": reason[:REASON_CHARS],
        "data": data[:QUARANTINED_DATA_BYTES],
        "data_bytes": len(data),
        "at": f"{time.time():.3f}",
    }


def queue_quarantine(pipe: Any, source: str, entry_id: str, data: bytes, reason: str) -> None:
    """Queue, on a (sync or async) Redis pipeline, what quarantining one record takes: its
    copy in the dead-letter stream and its count. For the records the live view reads
    (state keys, sampled decisions, config notifications), which nothing ingests."""
    pipe.xadd(
        QUARANTINE_STREAM,
        _quarantine_fields(source, entry_id, data, reason),
        maxlen=QUARANTINE_MAXLEN,
        approximate=True,
    )
    pipe.hincrby(QUARANTINE_COUNTS, source, 1)


def countable(raw: bytes | str | None) -> bool:
    """Whether a quarantine count as stored can be incremented (HINCRBY fails on anything
    but an integer, which a forged value would make of every later count)."""
    if raw is None:
        return True
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    return text.lstrip("-").isdigit() and text.isascii()


def count_repair(source: str, raw: bytes | str | None, wrong_type: bool) -> tuple | None:
    """The Redis command that makes ``source``'s quarantine count incrementable again, given
    what HGET returned (``wrong_type``: it failed, the counts key is not a hash), or None.
    A forged, non-integer count starts again from 0; a counts key of another type is
    renamed aside (kept for inspection)."""
    if wrong_type:
        aside = f"{QUARANTINE_COUNTS}:unreadable:{int(time.time())}"
        log.warning("%s is not a hash; renaming it to %s", QUARANTINE_COUNTS, aside)
        return ("RENAME", QUARANTINE_COUNTS, aside)
    if countable(raw):
        return None
    log.warning("quarantine count of %s was %r, not a number; counting from 0", source, raw)
    return ("HSET", QUARANTINE_COUNTS, source, 0)


def repair_count(client: redis.Redis, source: str) -> None:
    try:
        command = count_repair(source, client.hget(QUARANTINE_COUNTS, source), False)
    except redis.ResponseError:  # WRONGTYPE
        command = count_repair(source, None, True)
    if command:
        client.execute_command(*command)


def _settle(
    client: redis.Redis,
    stream: str,
    ids: list[bytes],
    poisoned: list[tuple[bytes, dict, str]],
    delete_acknowledged: bool,
) -> None:
    """Quarantine, count and acknowledge in one MULTI: all of it happens, or none."""
    if poisoned:
        repair_count(client, stream)
    pipe = client.pipeline(transaction=True)
    for entry_id, fields, reason in poisoned:
        pipe.xadd(
            QUARANTINE_STREAM,
            _quarantine_fields(stream, entry_id, raw_data(fields), reason),
            maxlen=QUARANTINE_MAXLEN,
            approximate=True,
        )
    if poisoned:
        pipe.hincrby(QUARANTINE_COUNTS, stream, len(poisoned))
    pipe.xack(stream, GROUP, *ids)
    if delete_acknowledged:
        pipe.xdel(stream, *ids)
    pipe.execute()


@dataclass
class Budget:
    """How much one ingest run of a stream kind takes on: entries are stored in slices of
    about ``slice_bytes``, each committed and acknowledged on its own, until ``run_bytes``
    (or ``run_s`` seconds) are spent; the rest waits, pending, for the next run. So no
    input, however large or slow to store, makes a run outlast its task's time limit,
    roll back and read the same entries again forever."""

    slice_bytes: int
    run_bytes: int
    run_s: float
    read_count: int = 16
    spent_bytes: int = 0
    started: float = field(default_factory=time.monotonic)

    def spent(self) -> bool:
        return self.spent_bytes >= self.run_bytes or time.monotonic() - self.started >= self.run_s


def _slices(entries: list[tuple[bytes, dict]], budget: Budget | None) -> list[list]:
    if budget is None:
        return [entries]
    slices: list[list] = [[]]
    size = 0
    for entry in entries:
        if slices[-1] and size >= budget.slice_bytes:
            slices.append([])
            size = 0
        slices[-1].append(entry)
        size += entry_bytes(entry[1])
    return slices


def _ingest(
    client: redis.Redis,
    stream: str,
    parse: Callable[[dict], Any],
    store: Callable[[Any, dict[str, Cluster]], bool],
    *,
    delete_acknowledged: bool = False,
    only: str | None = None,
    budget: Budget | None = None,
) -> IngestResult:
    """One batch (or, with a ``budget``, committed slices until it is spent): store every
    entry (each in its own savepoint) in one transaction, then quarantine the refused ones
    and acknowledge (and, for a stream nobody else reads, delete) them all. From a
    cluster's own stream (``only``: its name), an entry of any other cluster is
    quarantined: the routers writing there may speak for theirs only."""
    result = IngestResult()
    clusters: dict[str, Cluster] | None = None
    while budget is None or not budget.spent():
        entries = read_batch(client, stream, BATCH if budget is None else budget.read_count)
        if not entries:
            break
        if clusters is None:
            clusters = {c.name: c for c in Cluster.objects.all() if only is None or c.name == only}
        for piece in _slices(entries, budget):
            _ingest_slice(
                client, stream, piece, parse, store, clusters, result, delete_acknowledged
            )
            if budget is not None:
                budget.spent_bytes += sum(entry_bytes(fields) for _, fields in piece)
                if budget.spent():
                    break
        if budget is None:
            break
    return result


def _ingest_slice(
    client: redis.Redis,
    stream: str,
    entries: list[tuple[bytes, dict]],
    parse: Callable[[dict], Any],
    store: Callable[[Any, dict[str, Cluster]], bool],
    clusters: dict[str, Cluster],
    result: IngestResult,
    delete_acknowledged: bool,
) -> None:
    result.read += len(entries)
    poisoned: list[tuple[bytes, dict, str]] = []
    with transaction.atomic():
        for entry_id, fields in entries:
            outcome = _store_entry(fields, parse, store, clusters)
            if isinstance(outcome, str):
                poisoned.append((entry_id, fields, outcome))
            elif outcome:
                result.stored += 1
            else:
                result.duplicates += 1
    for entry_id, _, reason in poisoned:
        log.warning("%s entry %s quarantined: %s", stream, text(entry_id), reason)
    result.quarantined += len(poisoned)
    _settle(client, stream, [entry_id for entry_id, _ in entries], poisoned, delete_acknowledged)


def _ingest_streams(
    client: redis.Redis,
    shared: str | None,
    own: Callable[[str], str],
    parse: Callable[[dict], Any],
    store: Callable[[Any, dict[str, Cluster]], bool],
    routers_own: Callable[[str, str], str] | None = None,
    **options: Any,
) -> IngestResult:
    """A batch of the stream shared by every cluster (written by routers without a Redis
    identity of their own), then one of each cluster's own stream, then (``routers_own``)
    one of each router's own stream, whose entries are taken under that router's name
    only."""
    total = IngestResult()
    streams: list[tuple[str, str | None, Callable[[Any, dict[str, Cluster]], bool]]] = (
        [(shared, None, store)] if shared else []
    )
    for name in Cluster.objects.values_list("name", flat=True):
        streams.append((own(name), name, store))
    if routers_own is not None:
        pairs = RouterDeployment.objects.values_list("cluster__name", "name")
        streams += [(routers_own(c, r), c, _as_sender(r, store)) for c, r in pairs]
    for stream, only, stores in streams:
        try:
            result = _ingest(client, stream, parse, stores, only=only, **options)
        except redis.ResponseError as error:
            # A key of another type where a stream belongs (WRONGTYPE): that stream cannot
            # be read, and must not keep the other clusters' streams from being read.
            log.warning("cannot ingest %s: %s", stream, error)
            total.unreadable.append(stream)
            continue
        for counter in ("read", "stored", "duplicates", "quarantined"):
            setattr(total, counter, getattr(total, counter) + getattr(result, counter))
    return total


def _as_sender(
    router: str, store: Callable[[Any, dict[str, Cluster]], bool]
) -> Callable[[Any, dict[str, Cluster]], bool]:
    """``store`` for a router's own stream: a record there speaks for that router only."""

    def owned(item: Any, clusters: dict[str, Cluster]) -> bool:
        if item.router != router:
            raise PoisonEntry(
                f"a record of router {item.router[:80]!r} in router {router!r}'s own stream"
            )
        return store(item, clusters)

    return owned


def ingest_events(client: redis.Redis) -> IngestResult:
    return _ingest_streams(client, EVENTS_STREAM, events_stream, parse_event, store_event)


def ingest_metrics(client: redis.Redis) -> IngestResult:
    # Only ingest reads the metrics stream, so folded entries are deleted and the stream
    # holds only what is not ingested yet. (The events stream is also tailed by the
    # dashboard's publisher and stays capped by MAXLEN.)
    return _ingest_streams(
        client,
        METRICS_STREAM,
        metrics_stream,
        parse_metrics,
        store_metrics,
        routers_own=router_metrics_stream,
        delete_acknowledged=True,
    )


def ingest_captures(client: redis.Redis) -> IngestResult:
    """Captured requests into their captures (routers write them to their cluster's own
    stream only); stored entries are deleted, as for metrics. In committed slices within
    a budget (`Budget`): a captured prompt is large, and slow to store."""
    from . import captures

    return _ingest_streams(
        client,
        None,
        capture_stream,
        captures.parse_batch,
        captures.store_batch,
        delete_acknowledged=True,
        budget=Budget(CAPTURE_SLICE_BYTES, CAPTURE_RUN_BYTES, CAPTURE_RUN_S),
    )


def quarantine_summary(client: redis.Redis, limit: int = 50) -> QuarantineSummary:
    """Entries quarantined so far, per source stream, and the newest ``limit`` of them.
    Anything can write to Redis, so both are read as untrusted: an unreadable count reads
    as 0, a field that is not what ingest writes falls back to what can be known."""
    counts: dict[str, int] = {}
    for key, value in client.hscan_iter(QUARANTINE_COUNTS, count=100):
        source = text(key[:SOURCE_CHARS])
        counts[source] = counts.get(source, 0) + _count(value)
    # XREVRANGE gives an id and fields for each entry (redis-py's type admits None for both)
    newest = cast(
        "list[tuple[bytes, dict[bytes, bytes]]]",
        client.xrevrange(QUARANTINE_STREAM, count=limit) if limit > 0 else [],
    )
    entries = [_quarantined_entry(entry_id, fields) for entry_id, fields in newest]
    return QuarantineSummary(counts, entries)


SOURCE_CHARS = 200


def _count(value: bytes) -> int:
    try:
        return max(0, min(int(value), 2**63 - 1))
    except ValueError:
        return 0


def _quarantined_entry(entry_id: bytes, fields: dict[bytes, bytes]) -> QuarantinedEntry:
    def get(name: str, limit: int = SOURCE_CHARS) -> str:
        return text(fields.get(name.encode(), b"")[:limit])

    data = get("data", QUARANTINED_DATA_BYTES)
    return QuarantinedEntry(
        id=text(entry_id),
        source=get("source"),
        entry_id=get("entry_id"),
        reason=get("reason", REASON_CHARS),
        data=data,
        data_bytes=_count(fields.get(b"data_bytes", b"")) or len(data),
        at=_entry_time(get("at"), text(entry_id)),
    )


def _entry_time(at: str, entry_id: str) -> datetime:
    """The recorded time; else the stream id's (milliseconds since the epoch)."""
    for value, scale in ((at, 1.0), (entry_id.split("-", 1)[0], 1000.0)):
        try:
            seconds = float(value) / scale
            if 0 <= seconds <= LATEST_UNIX:
                return to_datetime(seconds)
        except ValueError:
            continue
    return to_datetime(0)
