"""Trace readers and token synthesis for replay.

Three public formats, auto-detected from the first line, normalised to :class:`TraceRecord`:

* **Mooncake** JSONL (``timestamp`` ms, ``input_length``, ``output_length``, ``hash_ids`` of
  512-token prefix-chained blocks);
* **Bailian/Qwen** JSONL (``timestamp`` s, ``chat_id``, ``parent_chat_id``, ``turn``
  1-based, ``type``, ``hash_ids`` of 16-token blocks, or of ``block_size`` tokens where a
  row says so, as a Switchyard traffic capture does); sessions are the ``parent_chat_id``
  chains followed back to their root;
* **Azure** LLM inference CSV (``TIMESTAMP``, ``ContextTokens``, ``GeneratedTokens``;
  lengths only, so every request gets private blocks and no prefix is shared).

Token synthesis (:func:`synthesize_tokens`): hash id ``h`` expands to the block of token
ids ``hi16(splitmix64(h) * lane[position]) + offset``, so equal ids give equal token runs and
the prompts share exactly the trace's prefixes; the last block is cut to the request's
length. Vectorised per request, no per-token Python.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

FORMATS = ("auto", "mooncake", "bailian", "azure")
MOONCAKE_BLOCK = 512
BAILIAN_BLOCK = 16
# Token ids in [TOKEN_OFFSET, TOKEN_OFFSET + 2**TOKEN_BITS): valid for every supported model's
# vocabulary and clear of the special tokens at the top of the Qwen and Llama vocabularies.
TOKEN_OFFSET = 1000
TOKEN_BITS = 16
_PRIVATE_ID_BASE = 1 << 62  # ids for requests without prefix info; real traces use small ints
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


class TraceFormatError(ValueError):
    """The file is not in a known trace format (the message names the line)."""


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One request of a trace, whatever the source format.

    ``hash_ids`` are the trace's prefix-block ids, each covering ``hash_block_size``
    tokens (the last one partially); empty when the trace has no prefix information.
    ``turn`` is 0-based (0 = first turn) when the trace knows it.
    """

    index: int
    arrival_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()
    hash_block_size: int = 0
    session_id: str | None = None
    turn: int | None = None
    kind: str | None = None
    tenant: str | None = None  # who sent it (flow control); None: the default tenant
    priority: str | None = None  # a class the request asked for (lower than its tenant's)

    @property
    def block_ids(self) -> tuple[int, ...]:
        """The prefix block ids, or private ids when the trace has none (never shared)."""
        if self.hash_ids:
            return self.hash_ids
        count = -(-self.input_tokens // MOONCAKE_BLOCK)
        base = _PRIVATE_ID_BASE + (self.index << 20)
        return tuple(range(base, base + count))

    @property
    def block_size(self) -> int:
        return self.hash_block_size or MOONCAKE_BLOCK


# ----------------------------------------------------------------- readers


def detect_format(path: str | Path) -> str:
    """``mooncake``, ``bailian`` or ``azure`` from the file's first non-empty line."""
    with open(path, encoding="utf-8") as handle:
        first = next((line for line in handle if line.strip()), "")
    if first.lstrip().startswith("{"):
        keys = json.loads(first).keys()
        if "chat_id" in keys or "parent_chat_id" in keys:
            return "bailian"
        if "hash_ids" in keys and "input_length" in keys:
            return "mooncake"
    elif "ContextTokens" in first and "GeneratedTokens" in first:
        return "azure"
    raise TraceFormatError(f"{path}: unrecognised trace format (first line {first[:80]!r})")


def _json_lines(path: str | Path) -> Iterator[tuple[int, dict]]:
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                try:
                    yield number, json.loads(line)
                except json.JSONDecodeError as exc:
                    raise TraceFormatError(f"{path}:{number}: {exc}") from None


def flow_fields(row: dict, where: str) -> dict[str, Any]:
    """A row's optional ``tenant`` and ``priority`` (for the router's flow control, which
    checks their values: enginesim.replay.simulator), each a string if present."""
    fields = {"tenant": row.get("tenant"), "priority": row.get("priority")}
    for name, value in fields.items():
        if value is not None and not isinstance(value, str):
            raise TraceFormatError(f"{where}: {name} must be a string, not {value!r}")
    return fields


def read_mooncake(path: str | Path) -> list[TraceRecord]:
    records: list[TraceRecord] = []
    for number, row in _json_lines(path):
        try:
            records.append(
                TraceRecord(
                    index=len(records),
                    arrival_s=row["timestamp"] / 1000.0,
                    input_tokens=int(row["input_length"]),
                    output_tokens=int(row["output_length"]),
                    hash_ids=tuple(row["hash_ids"]),
                    hash_block_size=MOONCAKE_BLOCK,
                    **flow_fields(row, f"{path}:{number}"),
                )
            )
        except KeyError as exc:
            raise TraceFormatError(f"{path}:{number}: missing field {exc}") from None
    return records


def read_bailian(path: str | Path) -> list[TraceRecord]:
    return read_bailian_rows([row for _, row in _json_lines(path)])


def read_bailian_rows(rows: list[dict]) -> list[TraceRecord]:
    """Bailian rows (dicts, as in the JSONL) → records in row order, sessions resolved."""
    parent = {row["chat_id"]: row.get("parent_chat_id", -1) for row in rows}
    roots: dict[int, int] = {}
    records: list[TraceRecord] = []
    for number, row in enumerate(rows, 1):
        turn = row.get("turn")
        records.append(
            TraceRecord(
                index=len(records),
                arrival_s=float(row["timestamp"]),
                input_tokens=int(row["input_length"]),
                output_tokens=int(row["output_length"]),
                hash_ids=tuple(row.get("hash_ids", ())),
                # a captured trace (Switchyard's own) names its routers' block size
                hash_block_size=int(row.get("block_size") or BAILIAN_BLOCK),
                session_id=f"chat-{_session_root(row['chat_id'], parent, roots)}",
                turn=None if turn is None else int(turn) - 1,
                kind=row.get("type"),
                **flow_fields(row, f"row {number}"),
            )
        )
    return records


def _session_root(chat_id: int, parent: dict[int, int], roots: dict[int, int]) -> int:
    """The first row of ``chat_id``'s session (a cycle ends where it closes). Every row
    walked is remembered with its root, so a whole trace resolves in linear time: a session
    of n turns walked row by row would take n²/2 steps (a one-session capture of 50k rows,
    minutes)."""
    path: list[int] = []
    seen: set[int] = set()
    while (
        chat_id not in roots and parent.get(chat_id, -1) not in (-1, None) and chat_id not in seen
    ):
        seen.add(chat_id)
        path.append(chat_id)
        chat_id = parent[chat_id]
    root = roots.get(chat_id, chat_id)
    for walked in path:
        roots[walked] = root
    roots[chat_id] = root
    return root


def _azure_seconds(stamp: str) -> float:
    # 7 fractional digits ("18:17:03.9799600") are more than datetime parses; split them off.
    whole, _, fraction = stamp.strip().partition(".")
    base = datetime.fromisoformat(whole).timestamp()
    return base + (float(f"0.{fraction}") if fraction else 0.0)


def read_azure(path: str | Path) -> list[TraceRecord]:
    records: list[TraceRecord] = []
    with open(path, encoding="utf-8", newline="") as handle:
        for row in csv.DictReader(handle):
            records.append(
                TraceRecord(
                    index=len(records),
                    arrival_s=_azure_seconds(row["TIMESTAMP"]),
                    input_tokens=int(row["ContextTokens"]),
                    output_tokens=int(row["GeneratedTokens"]),
                )
            )
    if records:
        start = records[0].arrival_s
        records = [replace(r, arrival_s=r.arrival_s - start) for r in records]
    return records


READERS = {"mooncake": read_mooncake, "bailian": read_bailian, "azure": read_azure}


def read_trace(path: str | Path, fmt: str = "auto") -> list[TraceRecord]:
    """All records of a trace file, sorted by arrival (stable), arrivals relative to the first."""
    if fmt not in FORMATS:
        raise TraceFormatError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    fmt = detect_format(path) if fmt == "auto" else fmt
    records = sorted(READERS[fmt](path), key=lambda r: r.arrival_s)
    return [replace(r, index=i) for i, r in enumerate(records)]


def select(
    records: Iterable[TraceRecord],
    *,
    rate_scale: float = 1.0,
    start_s: float = 0.0,
    end_s: float | None = None,
    max_requests: int | None = None,
) -> list[TraceRecord]:
    """Window ``[start_s, end_s)`` of trace time, then compress time by ``rate_scale``.

    ``rate_scale`` = 2 replays the window twice as fast (arrivals divided by 2, so twice
    the request rate). Arrivals are re-based to the window start; indices renumbered.
    """
    if rate_scale <= 0:
        raise ValueError(f"rate_scale must be positive, got {rate_scale}")
    chosen = [
        r for r in records if r.arrival_s >= start_s and (end_s is None or r.arrival_s < end_s)
    ]
    if max_requests is not None:
        chosen = chosen[:max_requests]
    return [
        replace(r, index=i, arrival_s=(r.arrival_s - start_s) / rate_scale)
        for i, r in enumerate(chosen)
    ]


def spread_ties(records: list[TraceRecord], seed: int = 0) -> list[TraceRecord]:
    """Spread arrivals that share a timestamp uniformly until the next distinct one.

    The Mooncake conversation trace stamps arrivals in 3 s buckets (about ten requests
    each): replayed as they are, a bucket arrives in one instant, which no real client
    does and which makes several routers behind a load balancer decide on the same view
    at once. Seeded; arrivals stay sorted, indices renumbered. The last bucket spreads
    over the trace's mean gap between buckets.
    """
    if not records:
        return []
    times = sorted({r.arrival_s for r in records})
    width = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 0.0
    next_time = dict(zip(times, [*times[1:], times[-1] + width], strict=True))
    rng = np.random.default_rng(seed)
    offsets = rng.random(len(records))
    moved = sorted(
        (r.arrival_s + float(u) * (next_time[r.arrival_s] - r.arrival_s), r.index, r)
        for u, r in zip(offsets, records, strict=True)
    )
    return [replace(r, index=i, arrival_s=t) for i, (t, _, r) in enumerate(moved)]


def retime(records: list[TraceRecord], seed: int, bin_s: float = 30.0) -> list[TraceRecord]:
    """The same requests in the same order at seeded new arrival times that keep the
    trace's arrival rate per ``bin_s`` bin: the n requests of a bin get n sorted uniform
    times in it (a Poisson process of the bin's rate, conditioned on its count). Which
    requests come together inside a bin, and so the bursts a router meets, change with the
    seed; the load profile at the bin's scale, the requests and their order do not."""
    if bin_s <= 0:
        raise ValueError(f"bin_s must be positive, got {bin_s}")
    if not records:
        return []
    rng = np.random.default_rng(seed)
    bins = np.floor(np.array([r.arrival_s for r in records]) / bin_s)
    times = np.empty(len(records))
    for b in np.unique(bins):
        where = np.flatnonzero(bins == b)
        times[where] = np.sort(rng.uniform(b * bin_s, (b + 1) * bin_s, len(where)))
    return [
        replace(r, index=i, arrival_s=float(t))
        for i, (t, r) in enumerate(zip(times, records, strict=True))
    ]


def load_trace(
    path: str | Path, fmt: str = "auto", **window: float | int | None
) -> list[TraceRecord]:
    """:func:`read_trace` then :func:`select` (``rate_scale``, ``start_s``, ``end_s``,
    ``max_requests``)."""
    return select(read_trace(path, fmt), **window)  # type: ignore[arg-type]


# ----------------------------------------------------------------- token synthesis


def _splitmix(x: np.ndarray) -> np.ndarray:
    x ^= x >> np.uint64(30)
    x *= _MIX1
    x ^= x >> np.uint64(27)
    x *= _MIX2
    x ^= x >> np.uint64(31)
    return x


def block_token_ids(block_ids: Iterable[int] | np.ndarray, block_size: int) -> np.ndarray:
    """Token ids of whole blocks, shape (len(block_ids), block_size), int64.

    Token j of block h is the top 16 bits of ``splitmix64(h) * lane_j`` (odd random
    lanes) plus an offset: one 64-bit mix per block and one multiply per token. Two
    different ids give equal blocks only if all lanes agree, which does not happen in
    practice (the tests check 200k ids).
    """
    ids = np.asarray(
        list(block_ids) if not isinstance(block_ids, np.ndarray) else block_ids, dtype=np.uint64
    )
    with np.errstate(over="ignore"):
        keys = _splitmix(ids * _GOLDEN + np.uint64(1))
        mixed = keys[:, None] * _lanes(block_size)[None, :]
    return (mixed >> np.uint64(64 - TOKEN_BITS)).astype(np.int64) + TOKEN_OFFSET


_LANES: dict[int, np.ndarray] = {}


def _lanes(block_size: int) -> np.ndarray:
    lanes = _LANES.get(block_size)
    if lanes is None:
        with np.errstate(over="ignore"):
            positions = np.arange(1, block_size + 1, dtype=np.uint64)
            lanes = _splitmix(positions * _MIX2) | np.uint64(1)
        _LANES[block_size] = lanes
    return lanes


def synthesize_tokens(record: TraceRecord) -> np.ndarray:
    """The record's prompt as token ids: its blocks expanded, the last one cut short."""
    tokens = block_token_ids(record.block_ids, record.block_size).reshape(-1)
    if len(tokens) < record.input_tokens:  # a trace row with too few ids: pad privately
        extra = -(-(record.input_tokens - len(tokens)) // record.block_size)
        base = _PRIVATE_ID_BASE + (1 << 61) + (record.index << 20)
        pad = block_token_ids(np.arange(base, base + extra, dtype=np.uint64), record.block_size)
        tokens = np.concatenate([tokens, pad.reshape(-1)])
    return tokens[: record.input_tokens]


def scale_tenant(
    records: Sequence[TraceRecord], tenant: str, factor: float, seed: int = 0
) -> list[TraceRecord]:
    """``tenant``'s requests ``factor`` times as many (what if this tenant doubles): each
    is kept ``floor(factor)`` times, once more with probability ``factor``'s fraction, the
    copies arriving within a second after it (seeded); the other tenants' requests are
    left as they are. Re-indexed in arrival order."""
    if not factor >= 0:
        raise ValueError(f"a tenant's scale must be >= 0, not {factor}")
    rng = np.random.default_rng(seed)
    whole, fraction = int(factor), factor - int(factor)
    out: list[TraceRecord] = []
    for record in records:
        if record.tenant != tenant:
            out.append(record)
            continue
        copies = whole + int(rng.random() < fraction)
        for copy in range(copies):
            shift = 0.0 if copy == 0 else float(rng.random())
            out.append(replace(record, arrival_s=record.arrival_s + shift))
    out.sort(key=lambda r: (r.arrival_s, r.index))
    return [replace(r, index=k) for k, r in enumerate(out)]
