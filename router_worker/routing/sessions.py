"""Session features derived statelessly from a request (SMetric, DESIGN.md §3).

* ``turn_index_from_messages``: in a chat request, the number of earlier
  assistant messages; 0 means a first turn.
* ``session_key_from_request``: the ``X-Session-ID`` header (case-insensitive),
  else the body's ``user`` field, else None.

The live router calls these when it parses a request and stores the results
in :class:`~router_worker.routing.features.RequestFeatures`; a replay trace can
fill the same fields from its own columns.

:class:`SessionTable` is a bounded LRU of session key → last instance, used
only when a session key is known but the turn is not (completions API).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any


def turn_index_from_messages(messages: Iterable[Mapping[str, Any]]) -> int:
    """Number of assistant messages before the request's own reply."""
    return sum(1 for message in messages if message.get("role") == "assistant")


def session_key_from_request(headers: Mapping[str, str], body: Mapping[str, Any]) -> str | None:
    """``X-Session-ID`` header if present, else body ``user`` (non-empty string), else None."""
    for name, value in headers.items():
        if name.lower() == "x-session-id" and value:
            return f"hdr:{value}"
    user = body.get("user")
    if isinstance(user, str) and user:
        return f"user:{user}"
    return None


class SessionTable:
    """Bounded LRU: session key → instance id of its last request."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._last: OrderedDict[str, str] = OrderedDict()

    def get(self, key: str) -> str | None:
        return self._last.get(key)

    def put(self, key: str, instance_id: str) -> None:
        self._last[key] = instance_id
        self._last.move_to_end(key)
        if len(self._last) > self.capacity:
            self._last.popitem(last=False)

    def __len__(self) -> int:
        return len(self._last)
