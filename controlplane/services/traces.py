"""Where replay traces live (the shared public traces and operators' uploads), storing and
pruning uploads, and checking a trace's rows before a replay spends memory on them."""

from __future__ import annotations

import csv
import json
import math
import os
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from django.conf import settings

from . import numbers
from .errors import ServiceError

TRACE_SUFFIXES = (".jsonl", ".csv")
# A row may ask for up to this many times the model's context. Longer than the context is
# normal in public traces (recorded on models with longer contexts; the engine refuses such
# a request and the replay counts it as refused, as vLLM would), but a row sixteen times
# over is a broken trace, and its prompt would be synthesised token by token.
LENGTH_FACTOR = 16
HASH_BLOCK = {"mooncake": 512, "bailian": 16}
MAX_HASH_ID = 2**63 - 1  # the simulator expands ids as unsigned 64-bit integers
UNSUPPORTED = "not a supported trace (Mooncake, Bailian, Azure)"


def traces_dir() -> Path:
    default = Path(settings.BASE_DIR).parent / "shared" / "traces"
    return Path(os.environ.get("SWITCHYARD_TRACES_DIR", default))


def uploads_dir() -> Path:
    return Path(settings.SWITCHYARD_VAR_DIR) / "replay-uploads"


def captures_dir() -> Path:
    """Where captured traffic is exported for replays (controlplane/services/captures.py)."""
    return Path(settings.SWITCHYARD_VAR_DIR) / "captures"


def shared_traces() -> list[str]:
    folder = traces_dir()
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if p.suffix in TRACE_SUFFIXES)


def resolve_trace(trace: str) -> Path:
    """`shared:<name>`, `upload:<name>` or `capture:<id>` → a file path."""
    origin, _, name = trace.partition(":")
    if origin == "capture":
        if not (name.isascii() and name.isdigit()):
            raise ServiceError(f"unknown trace {trace!r}", "trace")
        return captures_dir() / f"{int(name)}.jsonl"
    folder = {"shared": traces_dir(), "upload": uploads_dir()}.get(origin)
    if folder is None or not name or Path(name).name != name:
        raise ServiceError(f"unknown trace {trace!r}", "trace")
    return folder / name


# ----------------------------------------------------------------- uploads


def store_upload(filename: str, chunks: Iterable[bytes]) -> str:
    """Write an uploaded trace under a fresh name and return it as ``upload:<name>``. What
    is too big or not a trace of a known format is refused and deleted at once."""
    suffix = Path(filename or "").suffix.lower()
    limit = int(settings.SWITCHYARD_MAX_TRACE_UPLOAD_BYTES)
    if suffix not in TRACE_SUFFIXES:
        raise ServiceError(f"upload a .jsonl or .csv trace of at most {limit >> 20} MiB", "upload")
    uploads_dir().mkdir(parents=True, exist_ok=True)
    trace = f"upload:{uuid.uuid4().hex}{suffix}"
    path = resolve_trace(trace)
    try:
        _write_bounded(path, chunks, limit)
        trace_format(path)
    except BaseException:  # refused, or anything else: the file never stays behind
        path.unlink(missing_ok=True)
        raise
    return trace


def _write_bounded(path: Path, chunks: Iterable[bytes], limit: int) -> None:
    written = 0
    with path.open("wb") as out:
        for chunk in chunks:
            written += len(chunk)
            if written > limit:
                raise ServiceError(
                    f"upload a .jsonl or .csv trace of at most {limit >> 20} MiB", "upload"
                )
            out.write(chunk)


def discard_upload(trace: str) -> None:
    """Delete an uploaded trace (a job was not made from it); shared traces are kept."""
    if trace.startswith("upload:"):
        resolve_trace(trace).unlink(missing_ok=True)


def prune_uploads(older_than_s: float, keep: set[str]) -> int:
    """Delete uploaded traces last written more than ``older_than_s`` ago, except those in
    ``keep`` (``upload:<name>`` of jobs still waiting or running)."""
    folder = uploads_dir()
    if not folder.is_dir():
        return 0
    cutoff = time.time() - older_than_s
    deleted = 0
    for path in folder.iterdir():
        if f"upload:{path.name}" in keep or not path.is_file():
            continue
        if path.stat().st_mtime < cutoff:
            path.unlink(missing_ok=True)
            deleted += 1
    return deleted


# ----------------------------------------------------------------- contents


def trace_format(path: Path) -> str:
    from enginesim.replay.traces import TraceFormatError, detect_format

    try:
        return detect_format(path)
    except (TraceFormatError, UnicodeDecodeError, ValueError) as error:
        raise ServiceError(f"{UNSUPPORTED}: {_without_path(str(error), path)}", "upload") from None
    except RecursionError:  # JSON nested deeper than any trace's
        raise ServiceError(f"{UNSUPPORTED}: JSON nested too deep", "upload") from None


def model_context(model: str) -> int:
    """The served model's longest context (enginesim's model table, matched as a cluster's
    model is checked); the longest known context for a model it does not know."""
    from enginesim.engine import MODELS
    from enginesim.replay.policy_costs import UnknownHardwareError, model_key

    try:
        return MODELS[model_key(model)].max_model_len
    except UnknownHardwareError:
        return max(spec.max_model_len for spec in MODELS.values())


def check_trace(path: Path, model: str) -> int:
    """Check every row of a trace before it is replayed for ``model``; the number of rows.
    A malformed row, or one whose lengths no request to the model could have, is refused
    with its line number, before a replay would synthesise its prompt."""
    fmt = trace_format(path)
    context = model_context(model)
    bound = Bound(
        LENGTH_FACTOR * context, f"{LENGTH_FACTOR} × the {context}-token context of {model}"
    )
    rows = 0
    try:
        for number, row in _csv_rows(path) if fmt == "azure" else _json_rows(path):
            problem = _row_problem(fmt, row, bound)
            if problem:
                raise ServiceError(f"trace row {number}: {problem}", "trace")
            rows += 1
    except UnicodeDecodeError:
        raise ServiceError(f"{UNSUPPORTED}: the file is not UTF-8 text", "trace") from None
    except csv.Error as error:  # a field over csv's limit (128 KiB), a NUL
        raise ServiceError(f"trace row {rows + 2}: not CSV ({error})", "trace") from None
    if not rows:
        raise ServiceError("the trace holds no request", "trace")
    return rows


def _json_rows(path: Path) -> Iterator[tuple[int, Any]]:
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except ValueError as error:
                raise ServiceError(f"trace row {number}: not JSON ({error})", "trace") from None
            except RecursionError:
                raise ServiceError(f"trace row {number}: JSON nested too deep", "trace") from None


def _csv_rows(path: Path) -> Iterator[tuple[int, Any]]:
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        for row in reader:
            yield reader.line_num, row


@dataclass(frozen=True)
class Bound:
    tokens: int
    why: str


def _row_problem(fmt: str, row: Any, bound: Bound) -> str | None:
    if fmt == "azure":
        return (
            _length(row, "ContextTokens", bound, text=True)
            or _length(row, "GeneratedTokens", bound, text=True)
            or (
                None
                if _iso_time(row.get("TIMESTAMP"))
                else f"TIMESTAMP {row.get('TIMESTAMP')!r} is not a date and time"
            )
        )
    if not isinstance(row, dict):
        return "not a JSON object"
    timestamp = row.get("timestamp")
    if not _number(timestamp) or not 0 <= timestamp < 1e13:
        return f"timestamp {timestamp!r} is not a time (a number, 0 or more)"
    if fmt == "bailian" and not isinstance(row.get("chat_id"), int | str):
        return f"chat_id {row.get('chat_id')!r} is not an id"
    block_size = row.get("block_size")
    if block_size is not None and not (
        isinstance(block_size, int) and not isinstance(block_size, bool) and 1 <= block_size <= 4096
    ):
        return f"block_size {block_size!r} is not a block size (a whole number, 1 to 4096)"
    return (
        _length(row, "input_length", bound)
        or _length(row, "output_length", bound)
        or _hash_ids(row.get("hash_ids", []), bound.tokens // HASH_BLOCK[fmt] + 1)
    )


def _length(row: dict[str, Any], field: str, bound: Bound, text: bool = False) -> str | None:
    value = row.get(field)
    if text and isinstance(value, str) and (whole := numbers.digits(value.strip())) is not None:
        value = whole
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        return f"{field} {value!r} is not a token count (a whole number, 0 or more)"
    if value > bound.tokens:
        return f"{field} {value} is over {bound.tokens} tokens ({bound.why})"
    return None


def _hash_ids(ids: Any, most: int) -> str | None:
    if not isinstance(ids, list):
        return "hash_ids is not a list"
    if len(ids) > most:
        return f"hash_ids lists {len(ids)} blocks, more than {most} blocks of tokens"
    for value in ids:
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_HASH_ID:
            return f"hash_ids holds {value!r}, not a block id (a whole number, 0 to 2**63-1)"
    return None


def _number(value: Any) -> TypeGuard[int | float]:
    """A finite number (an int of any length too: math.isfinite would overflow on it)."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


def _iso_time(value: Any) -> bool:
    from datetime import datetime

    try:
        datetime.fromisoformat(str(value).strip().partition(".")[0])
    except ValueError:
        return False
    return True


def _without_path(message: str, path: Path) -> str:
    """enginesim's messages start with the file's path: the operator's file name is not it."""
    return message.replace(f"{path}: ", "").replace(str(path), "the file")
