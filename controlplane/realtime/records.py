"""Reading the routers' records from Redis defensively.

Anything that can write to Redis can write any bytes where a router's record belongs, so
a record is refused (with a reason) unless it is a JSON object of bounded size and depth
whose numbers are finite and bounded, and which the contract's model accepts. What passes
can be merged, summed and sent to browsers as JSON (which has no NaN or infinity) without
raising anywhere: no recursion limit, float overflow or non-finite value further on.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

# A 1000-instance cluster's state snapshot is well under 1 MiB.
MAX_RECORD_BYTES = 4 * 1024 * 1024
MAX_DEPTH = 16  # the contract's records nest 4 levels deep
# Large enough for any count, byte total or timestamp; small enough that sums and products
# of a few thousand of them stay finite.
MAX_MAGNITUDE = 1e18
REASON_CHARS = 500

Model = TypeVar("Model", bound=BaseModel)


class BadRecord(ValueError):
    """A record the control plane refuses; the message says why."""


def _number(text: str) -> float:
    value = float(text)
    if not abs(value) <= MAX_MAGNITUDE:  # also false for NaN
        raise BadRecord(f"number {text[:40]} is not finite or beyond ±{MAX_MAGNITUDE:g}")
    return value


def _integer(text: str) -> int:
    if len(text) > 19:
        raise BadRecord(f"number {text[:40]}… is beyond ±{MAX_MAGNITUDE:g}")
    value = int(text)
    if abs(value) > MAX_MAGNITUDE:
        raise BadRecord(f"number {text} is beyond ±{MAX_MAGNITUDE:g}")
    return value


def _constant(name: str) -> Any:
    raise BadRecord(f"{name} is not a JSON number")


def _depth(document: Any) -> int:
    """Nesting depth, without recursion."""
    deepest, level = 0, [document]
    while level:
        deepest += 1
        if deepest > MAX_DEPTH:
            return deepest
        level = [
            child
            for node in level
            if isinstance(node, dict | list)
            for child in (node.values() if isinstance(node, dict) else node)
            if isinstance(child, dict | list)
        ]
    return deepest


def load_object(raw: bytes | str) -> dict[str, Any]:
    """The JSON object in ``raw``, or BadRecord."""
    size = len(raw)
    if size > MAX_RECORD_BYTES:
        raise BadRecord(f"{size} bytes, more than {MAX_RECORD_BYTES}")
    try:
        document = json.loads(
            raw, parse_float=_number, parse_int=_integer, parse_constant=_constant
        )
    except RecursionError:
        raise BadRecord("nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as error:  # JSONDecodeError is a ValueError
        raise BadRecord(f"not JSON: {str(error)[:200]}") from None
    if not isinstance(document, dict):
        raise BadRecord(f"a JSON {type(document).__name__}, not an object")
    if _depth(document) > MAX_DEPTH:
        raise BadRecord(f"nested more than {MAX_DEPTH} levels deep")
    return document


def parse(model: type[Model], raw: bytes | str) -> Model:
    """``raw`` as ``model``, or BadRecord with the reason."""
    document = load_object(raw)
    try:
        return model.model_validate(document)
    except ValidationError as error:
        raise BadRecord(reason(error)) from None


def stream_data(fields: dict[bytes | str, bytes | str]) -> bytes | str:
    """The ``data`` field of a stream entry (the contract's only field), or BadRecord."""
    value = fields.get(b"data", fields.get("data"))
    if value is None:
        raise BadRecord("stream entry has no 'data' field")
    return value


def reason(error: Exception) -> str:
    if isinstance(error, ValidationError):
        text = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'record'}: {e['msg']}" for e in error.errors()
        )
    else:
        text = str(error)
    return text.strip()[:REASON_CHARS]
