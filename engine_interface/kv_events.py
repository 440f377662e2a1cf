"""vLLM's KV-cache events and their wire (``vllm/distributed/kv_events.py``), in one place:
what enginesim's engine emits and its server publishes, what the router decodes and its
index applies, and what the replay simulator hands from one to the other.

ZMQ: frames ``[topic, seq, payload]`` on the PUB socket and ``[b"", seq, payload]`` from
the replay socket, which ends a replay with ``END_SEQ`` (receiving and publishing them is
the router's and enginesim's server's job; nothing here does I/O).

The payload is a msgpack ``KVEventBatch`` (a msgspec struct), and depending on the vLLM
version the batch and its events are encoded either positionally (``array_like``) or as
maps:

* batch: ``[ts, events, data_parallel_rank]`` or
  ``{"ts": ..., "events": [...], "data_parallel_rank": ...}``
  (trailing fields equal to their default may be omitted: ``omit_defaults``);
* event, positional with the tag first (msgspec ``tag=True``)::

      ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
       lora_id, medium, lora_name, extra_keys, group_idx, ...]
      ["BlockRemoved", block_hashes, medium, group_idx]
      ["AllBlocksCleared"]

* event as a map: ``{"type": "BlockStored", "block_hashes": [...], ...}``.

``BlockStored`` when full blocks get computed and enter the prefix cache (one event per
request per step, the blocks in chain order, ``parent_block_hash`` = hash of the block
before the first, None at the start of a prompt); ``BlockRemoved`` when cached blocks are
evicted from the LRU free list; ``AllBlocksCleared`` on ``reset_prefix_cache`` (and when a
restarted instance comes back empty).

Field order checked against ``vllm/distributed/kv_events.py`` (BlockStored:
block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
lora_name, extra_keys, group_idx, kv_cache_spec_kind, ...; BlockRemoved:
block_hashes, medium, group_idx). Engine block hashes are ``int`` or ``bytes``
and stay opaque here; the router's ``KVIndex`` maps them to its own hashes. Unknown
event tags are skipped and counted.

Anything else that is not exactly these shapes and types (a string where a number belongs,
a map where a hash belongs, a negative block size, a token id outside uint64) raises
:class:`KVEventDecodeError`: the whole batch is refused, so what reaches the index is
always well-typed.

Pure (msgpack and numpy only): the router's routing code imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

SEQ_BYTES = 8  # a sequence number frame: big-endian, signed
END_SEQ = -1  # the replay socket's end marker
MEDIUM_GPU = "GPU"  # the ``medium`` of events about the engine's own (GPU) KV cache

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


_STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
)
_REMOVED_FIELDS = ("block_hashes", "medium")


def decode_kv_event_batch(payload: bytes) -> KVEventBatch:
    """Decode one msgpack KV event batch (positional or map encoding)."""
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise KVEventDecodeError(f"not msgpack: {type(exc).__name__} {exc}") from exc
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


def _batch_fields(raw: Any) -> tuple[float, list[Any] | tuple[Any, ...], int | None]:
    if isinstance(raw, dict):
        if "events" not in raw:
            raise KVEventDecodeError("batch map has no 'events'")
        ts, events, dp_rank = raw.get("ts", 0.0), raw["events"], raw.get("data_parallel_rank")
    elif isinstance(raw, list | tuple) and len(raw) >= 2:
        ts, events, dp_rank = raw[0], raw[1], raw[2] if len(raw) > 2 else None
    else:
        raise KVEventDecodeError(f"unexpected batch shape: {type(raw).__name__}")
    if not isinstance(events, list | tuple):
        raise KVEventDecodeError(f"events: expected a list, got {type(events).__name__}")
    return _number(ts, "ts"), events, _optional_int(dp_rank, "data_parallel_rank")


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
        return BlockRemoved(_hashes(fields), _optional_str(fields.get("medium"), "medium"))
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    return None


def _stored(fields: dict[str, Any]) -> BlockStored:
    if "token_ids" not in fields or "block_size" not in fields:
        raise KVEventDecodeError("malformed BlockStored: needs token_ids and block_size")
    block_size = fields["block_size"]
    if not _is_int(block_size) or block_size <= 0:
        raise KVEventDecodeError(f"block_size: expected a positive int, got {block_size!r:.40}")
    parent = fields.get("parent_block_hash")
    return BlockStored(
        block_hashes=_hashes(fields),
        parent_block_hash=None if parent is None else _hash_key(parent),
        token_ids=_token_ids(fields["token_ids"]),
        block_size=block_size,
        lora_id=_optional_int(fields.get("lora_id"), "lora_id"),
        medium=_optional_str(fields.get("medium"), "medium"),
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any, name: str) -> float:
    if not (_is_int(value) or isinstance(value, float)):
        raise KVEventDecodeError(f"{name}: expected a number, got {value!r:.40}")
    return float(value)


def _optional_int(value: Any, name: str) -> int | None:
    if value is not None and not _is_int(value):
        raise KVEventDecodeError(f"{name}: expected an int or nil, got {value!r:.40}")
    return value


def _optional_str(value: Any, name: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise KVEventDecodeError(f"{name}: expected a string or nil, got {value!r:.40}")
    return value


def _token_ids(value: Any) -> tuple[int, ...]:
    """Non-negative ints below 2**64; checked in numpy (a long prompt's event carries
    100k+ ids, and this runs on the router's event loop)."""
    if not isinstance(value, list | tuple):
        raise KVEventDecodeError(f"token_ids: expected a list of ints, got {value!r:.60}")
    if value:
        try:
            ids = np.asarray(value)
        except (ValueError, OverflowError):  # ragged nesting
            ids = None
        if ids is None or ids.ndim != 1 or ids.dtype.kind not in "iu":
            raise KVEventDecodeError(f"token_ids: expected a list of ints, got {value!r:.60}")
        if ids.min() < 0:
            raise KVEventDecodeError("token_ids: a token id is outside 0..2**64-1")
    return tuple(value)


def _hashes(fields: dict[str, Any]) -> tuple[EngineBlockHash, ...]:
    value = fields.get("block_hashes")
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise KVEventDecodeError(f"block_hashes: expected a list, got {value!r:.60}")
    return tuple(map(_hash_key, value))


def _hash_key(value: Any) -> EngineBlockHash:
    """An engine block hash: an int or bytes (msgpack may hand back a bytearray, or a list
    of them for a hash sent as a tuple: made hashable). Anything else is refused."""
    if isinstance(value, bytearray):
        value = bytes(value)
    if _is_int(value) or isinstance(value, bytes):
        return value
    if isinstance(value, list | tuple) and all(_is_int(p) or isinstance(p, bytes) for p in value):
        return tuple(value)  # type: ignore[return-value]
    raise KVEventDecodeError(f"block hash: expected an int or bytes, got {value!r:.40}")


def encode_kv_event_batch(batch: KVEventBatch, *, positional: bool = True) -> bytes:
    """Encode a batch the way vLLM does (tests and benches feed it to the decoder)."""
    events = [encode_event(e, positional=positional) for e in batch.events]
    if positional:
        return msgpack.packb([batch.ts, events, batch.data_parallel_rank])
    return msgpack.packb(
        {"ts": batch.ts, "events": events, "data_parallel_rank": batch.data_parallel_rank}
    )


def encode_event(event: KVEvent, *, positional: bool = True, medium: str | None = None) -> Any:
    """One event as vLLM puts it on the wire, every field in vLLM's order (``lora_name``
    always nil); ``medium`` is written for an event that names none (enginesim's server:
    ``MEDIUM_GPU``)."""
    tag = type(event).__name__
    if isinstance(event, BlockStored):
        values: list[Any] = [
            list(event.block_hashes),
            event.parent_block_hash,
            list(event.token_ids),
            event.block_size,
            event.lora_id,
            event.medium if event.medium is not None else medium,
            None,
        ]
        names: tuple[str, ...] = (*_STORED_FIELDS, "lora_name")
    elif isinstance(event, BlockRemoved):
        values = [list(event.block_hashes), event.medium if event.medium is not None else medium]
        names = _REMOVED_FIELDS
    else:
        values, names = [], ()
    if positional:
        return [tag, *values]
    return {"type": tag, **dict(zip(names, values, strict=True))}
