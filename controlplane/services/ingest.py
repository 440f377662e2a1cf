"""Ingest of the routers' Redis streams into Postgres.

Events (hotspot transitions, health changes, config applied, restarts) and metrics records
are read through a Redis consumer group and acknowledged only after the database commit,
so an outage of Postgres leaves them pending in Redis and an outage of Redis loses nothing
that was already written there. Rows are keyed by the router-assigned id, so a re-delivered
entry is ignored: ingest is idempotent and resumable.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis
from django.db import transaction
from pydantic import ValidationError

from controlplane.models import Cluster, HotspotEvent, IngestedRecord, RouterEvent
from router_worker.telemetry_contract import (
    EVENTS_STREAM,
    METRICS_STREAM,
    HotspotPayload,
    MetricsRecord,
)
from router_worker.telemetry_contract import RouterEvent as WireEvent

from . import rollups

log = logging.getLogger(__name__)
GROUP = "controlplane-ingest"
CONSUMER = "ingest"
BATCH = 500


@dataclass
class IngestResult:
    read: int = 0
    stored: int = 0
    duplicates: int = 0
    invalid: int = 0


def ensure_group(client: redis.Redis, stream: str) -> None:
    try:
        client.xgroup_create(stream, GROUP, id="0", mkstream=True)
    except redis.ResponseError as error:
        if "BUSYGROUP" not in str(error):
            raise


def read_batch(client: redis.Redis, stream: str) -> list[tuple[bytes, dict]]:
    """Own pending entries first (left unacknowledged by a failed run), then new ones."""
    ensure_group(client, stream)
    for start in ("0", ">"):
        response = client.xreadgroup(GROUP, CONSUMER, {stream: start}, count=BATCH)
        entries = response[0][1] if response else []
        if entries:
            return entries
    return []


def to_datetime(unix_seconds: float) -> datetime:
    return datetime.fromtimestamp(unix_seconds, tz=UTC)


def store_event(event: WireEvent, clusters: dict[str, Cluster]) -> bool:
    """Insert one event; False when it was already stored or names an unknown cluster."""
    cluster = clusters.get(event.cluster)
    if cluster is None:
        log.warning("event %s names unknown cluster %r; skipped", event.id, event.cluster)
        return False
    if event.kind == "hotspot":
        hotspot = HotspotPayload.model_validate(event.payload)
        _, created = HotspotEvent.objects.get_or_create(
            event_id=event.id,
            defaults={
                "cluster": cluster, "router": event.router, "at": to_datetime(event.at),
                "transition": hotspot.transition, "prefix_class": hotspot.prefix_class,
                "prefix_hash": hotspot.prefix_hash, "x": hotspot.x, "x_bar": hotspot.x_bar,
                "m": hotspot.m, "m_bar": hotspot.m_bar, "window": hotspot.window,
                "instances": hotspot.instances, "details": event.payload,
            },
        )
        return created
    _, created = RouterEvent.objects.get_or_create(
        event_id=event.id,
        defaults={"cluster": cluster, "router": event.router, "at": to_datetime(event.at),
                  "kind": event.kind, "payload": event.payload},
    )
    return created


def store_metrics(record: MetricsRecord, clusters: dict[str, Cluster]) -> bool:
    """Fold one metrics record into the rollups; False when already folded or unknown."""
    cluster = clusters.get(record.cluster)
    _, created = IngestedRecord.objects.get_or_create(record_id=record.id)
    if cluster is None or not created:
        return False
    rollups.fold(cluster, record)
    return True


def _ingest(client: redis.Redis, stream: str, parse: Callable[[dict], Any],
            store: Callable[[Any, dict[str, Cluster]], bool], *,
            delete_acknowledged: bool = False) -> IngestResult:
    """One batch: parse and store every entry in one transaction, then acknowledge (and,
    for a stream nobody else reads, delete) the entries."""
    entries = read_batch(client, stream)
    result = IngestResult(read=len(entries))
    if not entries:
        return result
    clusters = {c.name: c for c in Cluster.objects.all()}
    with transaction.atomic():
        for _, fields in entries:
            try:
                item = parse(fields)
            except (ValidationError, ValueError):
                result.invalid += 1
                continue
            if store(item, clusters):
                result.stored += 1
            else:
                result.duplicates += 1
    ids = [entry_id for entry_id, _ in entries]
    client.xack(stream, GROUP, *ids)
    if delete_acknowledged:
        client.xdel(stream, *ids)
    return result


def ingest_events(client: redis.Redis) -> IngestResult:
    return _ingest(client, EVENTS_STREAM, WireEvent.from_stream_fields, store_event)


def ingest_metrics(client: redis.Redis) -> IngestResult:
    # Only ingest reads the metrics stream, so folded entries are deleted and the stream
    # holds only what is not ingested yet. (The events stream is also tailed by the
    # dashboard's publisher and stays capped by MAXLEN.)
    return _ingest(client, METRICS_STREAM, MetricsRecord.from_stream_fields, store_metrics,
                   delete_acknowledged=True)
