"""Formatting filters for the dashboard templates."""

from __future__ import annotations

import json
from typing import Any

from django import template

register = template.Library()
DASH = "–"


def _number(value: Any) -> bool:
    """A value the number filters can show (a result missing a field reads as '')."""
    return isinstance(value, int | float) and not isinstance(value, bool)


@register.filter
def ms(seconds: float | None) -> str:
    """Seconds for people: 0.0123 → '12.3 ms', 58.35 → '58.4 s'."""
    if not _number(seconds):
        return DASH
    assert seconds is not None
    if seconds >= 10:
        return f"{seconds:,.1f} s"
    value = seconds * 1000
    return f"{value:.0f} ms" if value >= 100 else f"{value:.1f} ms"


@register.filter
def pct(ratio: float | None) -> str:
    return f"{ratio * 100:.1f}%" if _number(ratio) and ratio is not None else DASH


@register.filter
def num(value: float | None, digits: int = 1) -> str:
    if not _number(value) or value is None:
        return DASH
    return f"{value:,.{int(digits)}f}"


@register.filter
def ms_ci(interval: tuple[float, float] | None) -> str:
    if not interval:
        return ""
    return f"[{interval[0] * 1000:.1f}, {interval[1] * 1000:.1f}]"


@register.filter
def pretty_json(value: Any) -> str:
    return "" if value is None else json.dumps(value, indent=1, sort_keys=True, default=str)


BRIEF_CHARS = 60


@register.filter
def brief_json(value: Any) -> str:
    """One line of a JSON value, cut at BRIEF_CHARS: the summary of a collapsed one."""
    if value is None:
        return ""
    text = json.dumps(value, sort_keys=True, default=str, separators=(", ", ": "))
    return text if len(text) <= BRIEF_CHARS else text[: BRIEF_CHARS - 1] + "…"


@register.filter
def get(mapping: dict | None, key: Any) -> Any:
    return None if mapping is None else mapping.get(key)


@register.filter
def effect(ratio: float | None) -> str:
    """A relative change with its sign: 0.312 → '+31.2%'."""
    return DASH if ratio is None else f"{ratio * 100:+.1f}%"


@register.filter
def pvalue(p: float | None) -> str:
    return DASH if p is None else f"{p:.3g}"
