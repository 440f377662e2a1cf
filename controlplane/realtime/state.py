"""Reading the routers' latest state snapshots of a cluster from Redis (sync and async)."""

from __future__ import annotations

import logging
from typing import Any

import redis
import redis.asyncio as aioredis
from pydantic import ValidationError

from router_worker.telemetry_contract import StateSnapshot, loads_state, state_pattern

from .snapshot import merge_cluster

log = logging.getLogger(__name__)


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


def read_cluster(client: redis.Redis, cluster: str, cluster_id: int | None = None
                 ) -> dict[str, Any]:
    """The merged live snapshot of a cluster, read now (for the HTTP first paint)."""
    keys = sorted(client.scan_iter(match=state_pattern(cluster), count=200))
    raws = client.mget(keys) if keys else []
    return merge_cluster(cluster, parse_snapshots(raws), cluster_id=cluster_id)


async def scan_state_keys(client: aioredis.Redis, cluster: str) -> list[bytes]:
    return sorted([key async for key in client.scan_iter(match=state_pattern(cluster),
                                                          count=200)])
