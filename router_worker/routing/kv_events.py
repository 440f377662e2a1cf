"""Pure decoder for vLLM KV-cache event batches (msgpack).

vLLM publishes ``KVEventBatch`` messages over ZMQ (frames: topic, 8-byte
sequence number, msgpack payload; receiving them is the live router's job).
The payload is a msgspec struct, and depending on the vLLM version the batch
and its events are encoded either positionally (``array_like``) or as maps:

* batch: ``[ts, events, data_parallel_rank]`` or
  ``{"ts": ..., "events": [...], "data_parallel_rank": ...}``
  (trailing fields equal to their default may be omitted: ``omit_defaults``);
* event, positional with the tag first (msgspec ``tag=True``)::

      ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
       lora_id, medium, lora_name, extra_keys, group_idx, ...]
      ["BlockRemoved", block_hashes, medium, group_idx]
      ["AllBlocksCleared"]

* event as a map: ``{"type": "BlockStored", "block_hashes": [...], ...}``.

Field order checked against ``vllm/distributed/kv_events.py`` (BlockStored:
block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
lora_name, extra_keys, group_idx, kv_cache_spec_kind, ...; BlockRemoved:
block_hashes, medium, group_idx). Engine block hashes are ``int`` or ``bytes``
and stay opaque here; :class:`~router_worker.routing.kvindex.KVIndex` maps
them to router hashes. Unknown event tags are skipped and counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

EngineBlockHash = int | bytes


class KVEventDecodeError(ValueError):
    """The payload is not a KV event batch in either known encoding."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: tuple[EngineBlockHash, ...]
    parent_block_hash: EngineBlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[EngineBlockHash, ...]
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class KVEventBatch:
    ts: float
    events: tuple[KVEvent, ...]
    data_parallel_rank: int | None = None
    skipped_events: int = 0


_STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size",
                  "lora_id", "medium")
_REMOVED_FIELDS = ("block_hashes", "medium")


def decode_kv_event_batch(payload: bytes) -> KVEventBatch:
    """Decode one msgpack KV event batch (positional or map encoding)."""
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise KVEventDecodeError(f"not msgpack: {exc}") from exc
    ts, raw_events, dp_rank = _batch_fields(raw)
    events: list[KVEvent] = []
    skipped = 0
    for raw_event in raw_events:
        event = _decode_event(raw_event)
        if event is None:
            skipped += 1
        else:
            events.append(event)
    return KVEventBatch(float(ts), tuple(events), dp_rank, skipped)


def _batch_fields(raw: Any) -> tuple[float, list[Any], int | None]:
    if isinstance(raw, dict):
        if "events" not in raw:
            raise KVEventDecodeError("batch map has no 'events'")
        return raw.get("ts", 0.0), raw["events"], raw.get("data_parallel_rank")
    if isinstance(raw, list | tuple) and len(raw) >= 2 and isinstance(raw[1], list | tuple):
        return raw[0], raw[1], raw[2] if len(raw) > 2 else None
    raise KVEventDecodeError(f"unexpected batch shape: {type(raw).__name__}")


def _decode_event(raw: Any) -> KVEvent | None:
    if isinstance(raw, dict):
        tag = raw.get("type")
        fields = raw
    elif isinstance(raw, list | tuple) and raw and isinstance(raw[0], str):
        tag = raw[0]
        names = _STORED_FIELDS if tag == "BlockStored" else _REMOVED_FIELDS
        fields = dict(zip(names, raw[1:], strict=False))
    else:
        raise KVEventDecodeError(f"unexpected event shape: {raw!r:.80}")
    if tag == "BlockStored":
        return _stored(fields)
    if tag == "BlockRemoved":
        return BlockRemoved(tuple(_hashes(fields)), fields.get("medium"))
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    return None


def _stored(fields: dict[str, Any]) -> BlockStored:
    try:
        return BlockStored(
            block_hashes=tuple(_hashes(fields)),
            parent_block_hash=_hash_key(fields.get("parent_block_hash")),
            token_ids=tuple(fields["token_ids"]),
            block_size=int(fields["block_size"]),
            lora_id=fields.get("lora_id"),
            medium=fields.get("medium"),
        )
    except (KeyError, TypeError) as exc:
        raise KVEventDecodeError(f"malformed BlockStored: {exc}") from exc


def _hashes(fields: dict[str, Any]) -> list[EngineBlockHash]:
    return [_hash_key(h) for h in fields.get("block_hashes") or ()]


def _hash_key(value: Any) -> Any:
    # msgpack may hand back bytearray/list for opaque hashes; make them hashable.
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, list):
        return tuple(value)
    return value


def encode_kv_event_batch(batch: KVEventBatch, *, positional: bool = True) -> bytes:
    """Encode a batch the way vLLM does (used by tests and simulators)."""
    events = [_encode_event(e, positional) for e in batch.events]
    if positional:
        return msgpack.packb([batch.ts, events, batch.data_parallel_rank])
    return msgpack.packb(
        {"ts": batch.ts, "events": events, "data_parallel_rank": batch.data_parallel_rank}
    )


def _encode_event(event: KVEvent, positional: bool) -> Any:
    tag = type(event).__name__
    if isinstance(event, BlockStored):
        values = [list(event.block_hashes), event.parent_block_hash, list(event.token_ids),
                  event.block_size, event.lora_id, event.medium]
        names = _STORED_FIELDS
    elif isinstance(event, BlockRemoved):
        values, names = [list(event.block_hashes), event.medium], _REMOVED_FIELDS
    else:
        values, names = [], ()
    if positional:
        return [tag, *values]
    return {"type": tag, **dict(zip(names, values, strict=True))}
