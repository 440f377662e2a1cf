"""Reading what routers write to Redis for the live view: their latest state snapshots and
the cluster's sampled routing decisions (sync and async).

Every record goes through `records`: a malformed, oversized, too deeply nested or
non-finite one is skipped (the publisher also counts it in the quarantine, see
`publisher`), and the others are used as if it were not there. State keys are read with
GETRANGE, so an oversized value is never transferred whole, and a key of another Redis
type answers an error for that key alone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, cast

import redis
import redis.asyncio as aioredis

from router_worker.contract.telemetry import (
    DecisionRecord,
    StateSnapshot,
    decisions_stream,
    state_pattern,
)

from . import records
from .snapshot import merge_cluster

log = logging.getLogger(__name__)
# Decisions a live view shows (newest first); also the most the publisher sends at once.
DECISIONS_SHOWN = 50
StreamEntry = tuple[bytes | str, dict[bytes | str, bytes | str]]
# What a pipelined GETRANGE of a state key gave: its value, "" when the key is gone, or
# the error of a key that holds another type.
RawState = bytes | str | None | Exception


@dataclass(frozen=True)
class Rejected:
    """A record skipped as malformed: where it was, as it was (cut) and why."""

    source: str
    entry_id: str
    data: bytes
    reason: str


def group_name(cluster_id: int) -> str:
    """The Channels group of a cluster's live dashboards."""
    return f"cluster.{cluster_id}"


def queue_state_reads(pipe: Any, keys: list[bytes]) -> None:
    """Queue one bounded read per state key (a value over the limit is cut one byte past
    it, so the parser refuses it without the whole value crossing the network)."""
    for key in keys:
        pipe.getrange(key, 0, records.MAX_RECORD_BYTES)


def parse_state(raw: RawState) -> StateSnapshot | None:
    """One state key's snapshot; None when the key is gone; BadRecord when malformed."""
    if isinstance(raw, Exception):
        raise records.BadRecord(f"not a string value: {str(raw)[:200]}")
    if not raw:
        return None
    return records.parse(StateSnapshot, raw)


def parse_snapshots(raws: list[RawState]) -> list[StateSnapshot]:
    """Parse the values read; gone keys and malformed records are skipped."""
    parsed = []
    for raw in raws:
        try:
            snapshot = parse_state(raw)
        except records.BadRecord as error:
            log.warning("skipping malformed state snapshot: %s", error)
            continue
        if snapshot is not None:
            parsed.append(snapshot)
    return parsed


def read_cluster(
    client: redis.Redis, cluster: str, cluster_id: int | None = None
) -> dict[str, Any]:
    """The merged live snapshot of a cluster, read now (for the HTTP first paint)."""
    keys = sorted(client.scan_iter(match=state_pattern(cluster), count=200))
    raws: list[RawState] = []
    if keys:
        with client.pipeline(transaction=False) as pipe:
            queue_state_reads(pipe, keys)
            raws = pipe.execute(raise_on_error=False)
    return merge_cluster(cluster, parse_snapshots(raws), cluster_id=cluster_id)


async def scan_state_keys(client: aioredis.Redis, cluster: str) -> list[bytes]:
    return sorted([key async for key in client.scan_iter(match=state_pattern(cluster), count=200)])


def parse_decision(fields: dict[bytes | str, bytes | str]) -> dict[str, Any]:
    """One decision stream entry as a JSON-ready dict, or BadRecord."""
    return records.parse(DecisionRecord, records.stream_data(fields)).model_dump(mode="json")


def parse_decisions(
    entries: list[StreamEntry], rejected: list[Rejected] | None = None, source: str = ""
) -> list[dict[str, Any]]:
    """Decision stream entries as JSON-ready dicts, in the given order; malformed ones are
    skipped (anything that can write to Redis can write to the stream) and, when
    ``rejected`` is given, appended to it."""
    parsed = []
    for entry_id, fields in entries:
        try:
            parsed.append(parse_decision(fields))
        except records.BadRecord as error:
            log.warning("skipping malformed decision record: %s", error)
            if rejected is not None:
                rejected.append(Rejected(source, _text(entry_id), _entry_data(fields), str(error)))
    return parsed


def read_decisions(
    client: redis.Redis, cluster: str, count: int = DECISIONS_SHOWN
) -> list[dict[str, Any]]:
    """The cluster's most recent sampled decisions, newest first (for the first paint)."""
    # XREVRANGE gives an id and fields for each entry (redis-py's type admits None for both)
    entries = cast("list[StreamEntry]", client.xrevrange(decisions_stream(cluster), count=count))
    return parse_decisions(entries)


def decisions_since(
    client: redis.Redis, cluster: str, after: str | None, count: int
) -> tuple[list[dict[str, Any]], str | None]:
    """A page of the cluster's sampled decision stream, newest first, each with its entry
    ``id``, and the cursor to ask with next (the newest id seen; ``after`` itself when
    nothing is newer). Without ``after``: the newest ``count``. With it: the ``count``
    oldest entries after it, so a client polling with the cursor misses none that the
    capped stream still holds."""
    stream = decisions_stream(cluster)
    if after is None:
        entries = cast("list[StreamEntry]", client.xrevrange(stream, count=count))
    else:
        oldest = cast("list[StreamEntry]", client.xrange(stream, min=f"({after}", count=count))
        entries = oldest[::-1]
    page: list[dict[str, Any]] = []
    for entry_id, fields in entries:
        parsed = parse_decisions([(entry_id, fields)])
        page.extend({**decision, "id": _text(entry_id)} for decision in parsed)
    return page, (_text(entries[0][0]) if entries else after)


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _entry_data(fields: dict[bytes | str, bytes | str]) -> bytes:
    value = fields.get(b"data", fields.get("data"))
    if value is None:
        value = repr(fields)[: records.MAX_RECORD_BYTES]
    return value if isinstance(value, bytes) else str(value).encode(errors="replace")
