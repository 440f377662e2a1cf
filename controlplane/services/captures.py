"""Traffic captures: a cluster records its own traffic as a replayable trace.

Starting a capture publishes a config version carrying ``capture`` (its id and a fresh
salt): every router of the cluster then records each finished request, without its text
(router_worker/capture.py), and ingest stores the batches here (:func:`store_batch`),
the prompts' block hashes as keyed digests under the salt (so no stored or downloaded
trace reveals a prompt, and two captures share no id). A
capture stops when an operator stops it, at its request limit (checked at ingest) or at
its duration limit (:func:`enforce_limits`, run with ingest); each stop publishes a version
without ``capture``. Stopped captures are kept for ``SWITCHYARD_CAPTURE_RETENTION_DAYS``.

A capture exports as a Bailian-form JSONL trace (:func:`export_lines`): the routers' rows
merged in arrival order, sessions as ``parent_chat_id`` chains, plus the columns the
replay ignores and the fidelity check reads (instance, arm, the config version it was
routed under, status, measured TTFT/TPOT). Replays name it ``capture:<id>``.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import transaction
from django.db.models import F, Func, Q
from django.utils import timezone
from pydantic import Field

from controlplane.models import CapturedRequest, Cluster, TrafficCapture
from controlplane.selectors.captures import stored_rows
from router_worker.contract.capture import CaptureKey
from router_worker.contract.telemetry import (
    MAX_CAPTURE_BLOCKS,
    MAX_CAPTURE_ENTRY_BYTES,
    CaptureBatch,
    CaptureRecord,
    decode_block_hashes,
)

from . import audit, config, numbers
from .audit import Actor
from .clusters import locked_cluster
from .entries import LATEST_UNIX, PoisonEntry, entry_bytes
from .errors import Conflict, NotFound, Problems, ServiceError
from .fields import INT_COLUMN, max_length
from .traces import captures_dir

log = logging.getLogger(__name__)
DEFAULT_MAX_REQUESTS = 100_000
MAX_REQUESTS = 2_000_000
DEFAULT_MAX_MINUTES = 60
MAX_MINUTES = 7 * 24 * 60
SYSTEM = Actor.system("capture")
EXPORT_CHUNK = 2_000  # rows read from Postgres at a time while exporting
EXPORT_BLOCKS = 262_144  # block ids read at a time (a chunk of long prompts is fewer rows)
NAME_CHARS = 64


def snapshot(capture: TrafficCapture) -> dict[str, Any]:
    """What the audit trail keeps of a capture (never its salt)."""
    return {
        "name": capture.name,
        "state": capture.state,
        "requests": capture.requests,
        "max_requests": capture.max_requests,
        "max_duration_s": capture.max_duration_s,
        "stop_reason": capture.stop_reason,
    }


# ----------------------------------------------------------------- operator actions


@transaction.atomic
def start_capture(
    actor: Actor,
    cluster_id: int,
    *,
    name: str,
    max_requests: int | str | None = None,
    max_minutes: int | str | None = None,
    engine_time_scale: float | str | None = None,
    reason: str = "",
) -> TrafficCapture:
    """Start capturing the cluster's traffic. ``engine_time_scale``: wall seconds per
    engine second (1 for real engines; enginesim's ``--time-scale`` for a simulated
    cluster; unset: the cluster's), so that the trace is in the engines' own time."""
    problems = Problems()
    name = problems.check(_name, name) or ""
    limit = problems.check(
        _bounded, max_requests, DEFAULT_MAX_REQUESTS, MAX_REQUESTS, "max_requests"
    )
    minutes = problems.check(_bounded, max_minutes, DEFAULT_MAX_MINUTES, MAX_MINUTES, "max_minutes")
    scale = problems.check(_time_scale, engine_time_scale)
    problems.raise_any()
    cluster = locked_cluster(cluster_id)
    if engine_time_scale is None or engine_time_scale == "":
        scale = cluster.engine_time_scale or 1.0  # the cluster's own engines' scale
    running = cluster.captures.filter(state=TrafficCapture.State.CAPTURING).first()
    if running is not None:
        raise Conflict(f"{cluster.name} is already capturing ({running.name!r}); stop it first")
    capture = TrafficCapture.objects.create(
        cluster=cluster,
        name=name,
        salt=secrets.token_hex(32),
        max_requests=int(limit or DEFAULT_MAX_REQUESTS),
        max_duration_s=int(minutes or DEFAULT_MAX_MINUTES) * 60,
        engine_time_scale=scale or 1.0,
        started_by=actor.account,
    )
    config.publish(cluster, actor, reason or f"traffic capture {name!r} started")
    audit.record(
        actor, "capture.start", capture, after=snapshot(capture), reason=reason, cluster=cluster
    )
    return capture


@transaction.atomic
def stop_capture(actor: Actor, cluster_id: int, capture_id: int, *, reason: str = "") -> None:
    cluster = locked_cluster(cluster_id)
    capture = _capture(cluster, capture_id)
    if not capture.capturing:
        raise Conflict(f"capture {capture.name!r} is already stopped")
    _stop(actor, cluster, capture, f"stopped by {actor.name}", reason)


@transaction.atomic
def rename_capture(
    actor: Actor, cluster_id: int, capture_id: int, *, name: str, reason: str = ""
) -> TrafficCapture:
    cluster = locked_cluster(cluster_id)
    capture = _capture(cluster, capture_id)
    before = snapshot(capture)
    capture.name = _name(name)
    capture.save(update_fields=["name"])
    audit.record(
        actor,
        "capture.rename",
        capture,
        before=before,
        after=snapshot(capture),
        reason=reason,
        cluster=cluster,
    )
    return capture


@transaction.atomic
def delete_capture(actor: Actor, cluster_id: int, capture_id: int, *, reason: str = "") -> None:
    """Delete a capture and its rows (stopping it first if it runs)."""
    cluster = locked_cluster(cluster_id)
    capture = _capture(cluster, capture_id)
    if capture.capturing:  # the routers stop with the next version; one audit row, the delete
        capture.state = TrafficCapture.State.STOPPED
        capture.save(update_fields=["state"])
        config.publish(cluster, actor, reason or f"traffic capture {capture.name!r} deleted")
        capture.state = TrafficCapture.State.CAPTURING  # as it was, for the audit's before
    _delete(actor, cluster, capture, reason)


def _stop(
    actor: Actor, cluster: Cluster, capture: TrafficCapture, why: str, reason: str = ""
) -> None:
    before = snapshot(capture)
    capture.state = TrafficCapture.State.STOPPED
    capture.stopped_at = timezone.now()
    capture.stop_reason = why[: max_length(TrafficCapture, "stop_reason")]
    capture.save(update_fields=["state", "stopped_at", "stop_reason"])
    config.publish(cluster, actor, reason or f"traffic capture {capture.name!r} {why}")
    audit.record(
        actor,
        "capture.stop",
        capture,
        before=before,
        after=snapshot(capture),
        reason=reason or why,
        cluster=cluster,
    )


def _delete(actor: Actor, cluster: Cluster, capture: TrafficCapture, reason: str) -> None:
    before = snapshot(capture)
    exported = export_path(capture.pk)
    exports = list(captures_dir().glob(f"{capture.pk}-*.jsonl")) if captures_dir().is_dir() else []
    after = {"deleted": True, "requests_deleted": capture.requests}
    audit.record(
        actor, "capture.delete", capture, before=before, after=after, reason=reason, cluster=cluster
    )
    config.forget_capture_salt(cluster, capture.pk)
    capture.delete()
    for path in [exported, *exports]:
        path.unlink(missing_ok=True)


def _capture(cluster: Cluster, capture_id: int) -> TrafficCapture:
    capture = cluster.captures.filter(pk=capture_id).first()
    if capture is None:
        raise NotFound(f"capture {capture_id} of {cluster.name} does not exist")
    return capture


def _name(name: Any) -> str:
    name = name.strip() if isinstance(name, str) else ""
    if not name or len(name) > NAME_CHARS or not name.isprintable():
        raise ServiceError(f"name must be 1-{NAME_CHARS} printable characters", "name")
    return name


def _time_scale(value: Any) -> float:
    if value is None or (isinstance(value, str) and not value.strip()):
        return 1.0
    refused = ServiceError(
        "engine_time_scale must be a number from 0.001 to 1000", "engine_time_scale"
    )
    if isinstance(value, str):  # a form's text, read as every form reads numbers
        try:
            value = numbers.number(value, "engine_time_scale")
        except ServiceError:
            raise refused from None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.001 <= value <= 1000:
        raise refused
    return float(value)


def _bounded(value: Any, default: int, most: int, field: str) -> int:
    """A form's text (read as every form reads numbers; blank: ``default``) or an int."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return default
    refused = ServiceError(f"{field} must be a whole number from 1 to {most}", field)
    if isinstance(value, str):
        try:
            value = numbers.whole_number(value, field)
        except ServiceError:
            raise refused from None
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= most:
        raise refused
    return value


# ----------------------------------------------------------------- ingest and limits

Latency = Annotated[float, Field(ge=0, le=3600)]
Tokens = Annotated[int, Field(ge=0, le=INT_COLUMN)]
MAX_BLOCKS = MAX_CAPTURE_BLOCKS  # a million tokens in 16-token blocks
_ID_MASK = (1 << 63) - 1  # ids are signed 64-bit (the column, every trace reader)


class StorableRequest(CaptureRecord):
    """The contract's request narrowed to what the rows can hold."""

    at: float = Field(ge=0, le=LATEST_UNIX)
    prompt_tokens: Tokens
    output_tokens: Tokens
    block_size: int = Field(ge=1, le=4096)
    # a router from before the cap may send more blocks: the first MAX_BLOCKS are kept
    block_hashes: str = Field(default="", max_length=MAX_CAPTURE_ENTRY_BYTES)
    session: str | None = Field(default=None, max_length=32)
    turn: int | None = Field(default=None, ge=0, le=INT_COLUMN)
    tenant: str | None = Field(default=None, max_length=32, pattern=r"^[A-Za-z0-9]+$")
    priority: Literal["critical", "standard", "sheddable"] | None = None
    instance: str = Field(default="", max_length=64)
    arm: str = Field(default="", max_length=64)
    config_version: int | None = Field(default=None, ge=0, le=INT_COLUMN)
    status: int = Field(default=0, ge=0, le=999)
    ttft_s: Latency | None = None
    tpot_s: Latency | None = None


class StorableBatch(CaptureBatch):
    """The batch's own fields checked; its requests one by one at storage (`store_batch`),
    so one request the rows cannot hold (an oversize prompt, a negative count) is dropped
    and counted, never its whole batch."""

    id: str = Field(min_length=1, max_length=64)
    max_model_len: int | None = Field(default=None, ge=1, le=INT_COLUMN)
    router: str = Field(min_length=1, max_length=64)
    capture: int = Field(ge=1, le=2**63 - 1)
    requests: list[dict[str, Any]]  # type: ignore[assignment]


def parse_batch(fields: dict) -> CaptureBatch:
    size = entry_bytes(fields)
    if size > MAX_CAPTURE_ENTRY_BYTES:  # a router bounds its entries below this
        raise PoisonEntry(f"{size} bytes, more than {MAX_CAPTURE_ENTRY_BYTES}")
    return StorableBatch.from_stream_fields(fields)


def store_batch(batch: CaptureBatch, clusters: dict[str, Cluster]) -> bool:
    """Store one router batch; False when it was stored before or its capture is gone (a
    router may still flush a few requests after a capture was deleted)."""
    cluster = clusters.get(batch.cluster)
    if cluster is None:
        raise PoisonEntry(f"unknown cluster {batch.cluster[:80]!r}")
    if not cluster.routers.filter(name=batch.router).exists():
        raise PoisonEntry(f"unknown router {batch.router[:80]!r} of cluster {cluster.name!r}")
    locked = locked_cluster(cluster.pk)  # the cluster first, as every capture action does
    capture = locked.captures.select_for_update().filter(pk=batch.capture).first()
    if capture is None or CapturedRequest.objects.filter(batch=batch.id).exists():
        return False
    key = CaptureKey(capture.salt)
    rows = [
        row
        for row in (_row(capture, batch, raw, key) for raw in batch.requests)
        if row is not None and _admitted(capture, row.at)
    ]
    room = max(0, capture.max_requests - capture.requests)
    kept = rows[:room]
    CapturedRequest.objects.bulk_create(kept)
    capture.requests += len(kept)
    capture.dropped += len(batch.requests) - len(kept)
    if batch.max_model_len is not None:  # the smallest any router saw
        capture.max_model_len = min(
            capture.max_model_len or batch.max_model_len, batch.max_model_len
        )
    capture.save(update_fields=["requests", "dropped", "max_model_len"])
    if capture.capturing and capture.requests >= capture.max_requests:
        _stop(SYSTEM, locked, capture, f"reached its limit of {capture.max_requests} requests")
    return True


def _row(
    capture: TrafficCapture, batch: CaptureBatch, raw: Any, key: CaptureKey
) -> CapturedRequest | None:
    """The stored row, its block hashes as keyed digests (keyed by the router, or here for
    a router from before keying); None for a request the rows cannot hold (dropped)."""
    try:
        request = StorableRequest.model_validate(raw)
        hashes = decode_block_hashes(request.block_hashes, MAX_CAPTURE_ENTRY_BYTES // 8)
    except ValueError as error:  # pydantic's ValidationError is one
        log.info("capture %s: a request of batch %s dropped: %s", capture.pk, batch.id, error)
        return None
    hashes = hashes[:MAX_BLOCKS]
    ids = [value & _ID_MASK for value in hashes] if batch.keyed else key.block_ids(hashes)
    return CapturedRequest(
        capture=capture,
        batch=batch.id,
        router=batch.router,
        hash_ids=ids,
        **request.model_dump(exclude={"block_hashes"}),
    )


def _admitted(capture: TrafficCapture, at: float) -> bool:
    """A stopped capture takes what arrived before its stop (routers flush every quarter
    second, so their last requests come in after it)."""
    return capture.capturing or capture.stopped_at is None or at <= capture.stopped_at.timestamp()


def enforce_limits(now: Any = None) -> dict[str, int]:
    """Stop captures past their duration; delete stopped ones past the retention."""
    now = now or timezone.now()
    stopped = deleted = 0
    for capture in TrafficCapture.objects.filter(state=TrafficCapture.State.CAPTURING):
        if capture.started_at + timedelta(seconds=capture.max_duration_s) <= now:
            stopped += _stop_for_age(capture.pk)
    retention = timedelta(days=float(settings.SWITCHYARD_CAPTURE_RETENTION_DAYS))
    for capture in TrafficCapture.objects.filter(stopped_at__lt=now - retention):
        with transaction.atomic():
            cluster = locked_cluster(capture.cluster_id)
            _delete(SYSTEM, cluster, capture, "past the capture retention period")
            deleted += 1
    return {"stopped": stopped, "deleted": deleted}


@transaction.atomic
def _stop_for_age(capture_id: int) -> int:
    capture = TrafficCapture.objects.select_related("cluster").get(pk=capture_id)
    cluster = locked_cluster(capture.cluster_id)
    capture.refresh_from_db()
    if not capture.capturing:
        return 0
    minutes = capture.max_duration_s // 60
    _stop(SYSTEM, cluster, capture, f"reached its limit of {minutes} minutes")
    return 1


# ----------------------------------------------------------------- export


def export_lines(capture: TrafficCapture, until: int | None = None) -> Iterator[str]:
    """The capture as Bailian-form JSONL: times from its first request, in the engines'
    own time (wall time ÷ ``engine_time_scale``, TTFT and TPOT too), one chat id per
    request, each session's requests chained by ``parent_chat_id``. ``until``: only the
    rows stored up to then (`last_row`), the capture as a replay job saw it."""
    export = Export(capture, until)
    while chunk := export.next_chunk():
        yield from chunk


async def export_chunks(capture: TrafficCapture, until: int | None = None) -> AsyncIterator[str]:
    """`export_lines` for a download under ASGI: an async generator, each chunk (at most
    `EXPORT_CHUNK` rows and `EXPORT_BLOCKS` block ids) read in a thread of its own, so
    the server sends the trace as it is read instead of building it whole in memory (a
    sync iterator behind StreamingHttpResponse is read to its end first under ASGI)."""
    export = Export(capture, until)
    read = sync_to_async(export.next_chunk, thread_sensitive=True)
    while chunk := await read():
        yield "".join(chunk)


def download(actor: Actor, capture: TrafficCapture) -> AsyncIterator[str]:
    """The capture's trace for a download (`export_chunks`), the download audited: who
    took which capture, with how many requests, from where."""
    audit.record(
        actor,
        "capture.download",
        capture,
        after={"name": capture.name, "requests": capture.requests},
        cluster=capture.cluster,
    )
    return export_chunks(capture)


class Export:
    """The rows of a capture in arrival order, read a bounded chunk at a time (by keyset,
    so no cursor stays open between chunks), as trace lines."""

    def __init__(self, capture: TrafficCapture, until: int | None = None) -> None:
        self.capture, self.until = capture, until
        self.scale = capture.engine_time_scale or 1.0
        self.last_of_session: dict[str, int] = {}
        self.turns: dict[str, int] = {}
        self.start: float | None = None
        self.chat_id = 0
        self.after: tuple[float, int] | None = None  # the last row read: (at, pk)

    def next_chunk(self) -> list[str]:
        rows = stored_rows(self.capture, self.until)
        if self.after is not None:
            at, pk = self.after
            rows = rows.filter(Q(at__gt=at) | Q(at=at, pk__gt=pk))
        rows = rows.order_by("at", "pk")
        head = rows.annotate(blocks=Func(F("hash_ids"), function="cardinality")).values_list(
            "pk", "blocks"
        )[:EXPORT_CHUNK]
        taken: list[int] = []
        blocks = 0
        for pk, count in head:
            if taken and blocks + (count or 0) > EXPORT_BLOCKS:
                break
            taken.append(pk)
            blocks += count or 0
        if not taken:
            return []
        lines = [self._line(row) for row in rows.filter(pk__in=taken)]
        return lines

    def _line(self, row: CapturedRequest) -> str:
        self.chat_id += 1
        self.after = (row.at, row.pk)
        self.start = row.at if self.start is None else self.start
        parent, turn = -1, 1
        if row.session:
            parent = self.last_of_session.get(row.session, -1)
            turn = self.turns.get(row.session, 0) + 1
            self.last_of_session[row.session], self.turns[row.session] = self.chat_id, turn
        turn = turn if row.turn is None else row.turn + 1
        return _line(row, self.chat_id, parent, turn, self.start, self.scale)


def _line(
    row: CapturedRequest, chat_id: int, parent: int, turn: int, start: float, scale: float
) -> str:
    document = {
        "chat_id": chat_id,
        "parent_chat_id": parent,
        "timestamp": round((row.at - start) / scale, 6),
        "input_length": row.prompt_tokens,
        "output_length": row.output_tokens,
        "type": "text",
        "turn": turn,
        "hash_ids": row.hash_ids,
        "block_size": row.block_size,
        "session": row.session,
        **({"tenant": row.tenant} if row.tenant else {}),
        **({"priority": row.priority} if row.priority else {}),
        "router": row.router,
        "instance": row.instance,
        "arm": row.arm,
        "config_version": row.config_version,
        "status": row.status,
        "ttft_s": None if row.ttft_s is None else row.ttft_s / scale,
        "tpot_s": None if row.tpot_s is None else row.tpot_s / scale,
    }
    return json.dumps(document, separators=(",", ":")) + "\n"


def export_path(capture_id: int, until: int | None = None) -> Path:
    """``<id>.jsonl``, or ``<id>-<until>.jsonl`` for the capture as a job pinned it."""
    suffix = "" if until is None else f"-{until}"
    return captures_dir() / f"{capture_id}{suffix}.jsonl"


def prune_exports(older_than_s: float, keep: set[str]) -> int:
    """Delete capture exports (`export_for_replay`) last written more than ``older_than_s``
    ago, except the files named in ``keep`` (those of jobs still waiting or running)."""
    folder = captures_dir()
    if not folder.is_dir():
        return 0
    cutoff = time.time() - older_than_s
    deleted = 0
    for path in folder.glob("*.jsonl"):
        if path.name not in keep and path.is_file() and path.stat().st_mtime < cutoff:
            path.unlink(missing_ok=True)
            deleted += 1
    return deleted


def require_replayable(cluster_id: int, capture_id: int) -> TrafficCapture:
    capture = TrafficCapture.objects.filter(pk=capture_id, cluster_id=cluster_id).first()
    if capture is None:
        raise ServiceError(f"capture {capture_id} of this cluster does not exist", "trace")
    if not capture.requests:
        raise ServiceError(f"capture {capture.name!r} holds no request yet", "trace")
    return capture


def export_for_replay(cluster_id: int, capture_id: int, until: int | None = None) -> Path:
    """Write the capture's trace (up to row ``until``) for a replay, once per worker host
    (atomically: a replay reading an earlier export keeps it)."""
    capture = require_replayable(cluster_id, capture_id)
    path = export_path(capture.pk, until)
    if until is not None and path.is_file():
        return path  # the same rows: another cell on this host wrote it
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.part")
    with partial.open("w", encoding="utf-8") as out:
        out.writelines(export_lines(capture, until))
    partial.replace(path)
    return path


# ----------------------------------------------------------------- fidelity
