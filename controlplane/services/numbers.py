"""Numbers as operators type them: one strict reading for every form and every number the
API takes as text (query parameters), so a typo is refused with its field named instead of
becoming another number, a null or an error page.

A number is written in decimal, optionally signed and with an exponent (``2``, ``-1.5``,
``.5``, ``2e3``): nothing else (``2e``, ``1.2.3``, ``1_0``, ``0x10``, ``inf``, ``nan`` and
anything longer than `MAX_CHARS` are refused). A whole number is digits only, optionally
signed, at most `MAX_WHOLE_DIGITS` of them (it fits a 64-bit column and never reaches
Python's 4,300-digit conversion limit). A blank field is the caller's to read: every form
states "blank: the default" beside such a field, and never turns a blank into a null.
"""

from __future__ import annotations

import math
import re
from typing import TypeVar

from .errors import ServiceError

N = TypeVar("N", int, float)

MAX_CHARS = 40
MAX_WHOLE_DIGITS = 18
_DECIMAL = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_WHOLE = re.compile(r"[+-]?\d+")


def _shown(text: str) -> str:
    return repr(text if len(text) <= MAX_CHARS else text[:MAX_CHARS] + "…")


def whole_number(
    text: str, field: str, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    """``text`` as a whole number (within ``minimum`` and ``maximum`` when given);
    ServiceError naming ``field`` otherwise."""
    value = text.strip() if isinstance(text, str) else ""
    digits = len(value.lstrip("+-"))
    if not (value.isascii() and _WHOLE.fullmatch(value)) or digits > MAX_WHOLE_DIGITS:
        raise ServiceError(f"{field}: {_shown(str(text))} is not a whole number", field)
    return _bounded(int(value), field, minimum, maximum)


def number(
    text: str, field: str, *, minimum: float | None = None, maximum: float | None = None
) -> int | float:
    """``text`` as a number: an int when it is written as one (so messages echo "-1", not
    "-1.0"), else a finite float; ServiceError naming ``field`` otherwise."""
    value = text.strip() if isinstance(text, str) else ""
    if _WHOLE.fullmatch(value) and value.isascii() and len(value) <= MAX_WHOLE_DIGITS:
        return _bounded(int(value), field, minimum, maximum)
    if not (len(value) <= MAX_CHARS and value.isascii() and _DECIMAL.fullmatch(value)):
        raise ServiceError(f"{field}: {_shown(str(text))} is not a number", field)
    parsed = float(value)
    if not math.isfinite(parsed):
        raise ServiceError(f"{field}: {_shown(value)} is out of range", field)
    return _bounded(parsed, field, minimum, maximum)


def _bounded(value: N, field: str, minimum: float | None, maximum: float | None) -> N:
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        low = "" if minimum is None else f"{minimum:g}"
        high = "" if maximum is None else f"{maximum:g}"
        span = (
            f"from {low} to {high}"
            if low and high
            else (f"at least {low}" if low else f"at most {high}")
        )
        raise ServiceError(f"{field} must be {span}", field)
    return value


def digits(text: object) -> int | None:
    """``text`` if it is ASCII digits only, at most `MAX_WHOLE_DIGITS` of them, as an int;
    else None. For ids in query strings and form choices: a longer one names no row (and
    past 4,300 digits Python refuses to convert it at all)."""
    if (
        isinstance(text, str)
        and text.isascii()
        and text.isdigit()
        and len(text) <= MAX_WHOLE_DIGITS
    ):
        return int(text)
    return None
