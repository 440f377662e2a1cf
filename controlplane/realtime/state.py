"""Reading what routers write to Redis for the live view: their latest state snapshots and
the cluster's sampled routing decisions (sync and async)."""

from __future__ import annotations

import logging
from typing import Any

import redis
import redis.asyncio as aioredis
from pydantic import ValidationError

from router_worker.telemetry_contract import (
    DecisionRecord,
    StateSnapshot,
    decisions_stream,
    loads_state,
    state_pattern,
)

from .snapshot import merge_cluster

log = logging.getLogger(__name__)
# Decisions a live view shows (newest first); also the most the publisher sends at once.
DECISIONS_SHOWN = 50
StreamEntry = tuple[bytes | str, dict[bytes | str, bytes | str]]


def group_name(cluster_id: int) -> str:
    """The Channels group of a cluster's live dashboards."""
    return f"cluster.{cluster_id}"


def parse_snapshots(raws: list[bytes | str | None]) -> list[StateSnapshot]:
    """Parse what MGET returned; expired keys (None) and malformed records are skipped."""
    parsed = []
    for raw in raws:
        if raw is None:
            continue
        try:
            parsed.append(loads_state(raw))
        except (ValueError, ValidationError) as error:
            log.warning("skipping malformed state snapshot: %s", error)
    return parsed


def read_cluster(
    client: redis.Redis, cluster: str, cluster_id: int | None = None
) -> dict[str, Any]:
    """The merged live snapshot of a cluster, read now (for the HTTP first paint)."""
    keys = sorted(client.scan_iter(match=state_pattern(cluster), count=200))
    raws = client.mget(keys) if keys else []
    return merge_cluster(cluster, parse_snapshots(raws), cluster_id=cluster_id)


async def scan_state_keys(client: aioredis.Redis, cluster: str) -> list[bytes]:
    return sorted([key async for key in client.scan_iter(match=state_pattern(cluster), count=200)])


def parse_decisions(entries: list[StreamEntry]) -> list[dict[str, Any]]:
    """Decision stream entries as JSON-ready dicts, in the given order; malformed ones are
    skipped (anything that can write to Redis can write to the stream)."""
    parsed = []
    for _entry_id, fields in entries:
        try:
            parsed.append(DecisionRecord.from_stream_fields(fields).model_dump(mode="json"))
        except (ValueError, ValidationError) as error:
            log.warning("skipping malformed decision record: %s", error)
    return parsed


def read_decisions(
    client: redis.Redis, cluster: str, count: int = DECISIONS_SHOWN
) -> list[dict[str, Any]]:
    """The cluster's most recent sampled decisions, newest first (for the first paint)."""
    return parse_decisions(client.xrevrange(decisions_stream(cluster), count=count))
