"""Session features derived statelessly from a request (SMetric: docs/algorithms.md).

* ``turn_index_from_messages``: in a chat request, the number of earlier
  assistant messages; 0 means a first turn.
* ``session_key_from_request``: the ``X-Session-ID`` header (case-insensitive),
  else the body's ``user`` field, else None (either one, when over ``MAX_KEY_CHARS``,
  replaced by its digest).

The live router calls these when it parses a request and stores the results
in :class:`~router_worker.routing.features.RequestFeatures`; a replay trace can
fill the same fields from its own columns.

:class:`SessionTable` is a bounded LRU of session key → last instance, used
only when a session key is known but the turn is not (completions API). It holds a
fixed-size digest of each key, never the key: a client's ``user`` or ``X-Session-ID`` may
be megabytes long, and the table keeps up to ``session_table_size`` of them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from hashlib import blake2b
from typing import Any

# 128 bits: two different session keys colliding is out of reach (birthday bound 2**64).
DIGEST_BYTES = 16
# A longer session value (``user``, ``X-Session-ID``) is replaced by its digest where it is
# read, so no copy of it outlives the request, nor is it hashed more than once.
MAX_KEY_CHARS = 256


def turn_index_from_messages(messages: Iterable[Mapping[str, Any]]) -> int:
    """Number of assistant messages before the request's own reply."""
    return sum(1 for message in messages if message.get("role") == "assistant")


def session_key_from_request(headers: Mapping[str, str], body: Mapping[str, Any]) -> str | None:
    """``X-Session-ID`` header if present, else body ``user`` (non-empty string), else None."""
    for name, value in headers.items():
        if name.lower() == "x-session-id" and value:
            return f"hdr:{compact_key(value)}"
    user = body.get("user")
    if isinstance(user, str) and user:
        return f"user:{compact_key(user)}"
    return None


def compact_key(value: str) -> str:
    """``value`` itself when short, else a fixed-size digest of it (a long ``user`` is legal
    OpenAI input: never refused, only not kept)."""
    if len(value) <= MAX_KEY_CHARS:
        return value
    return "blake2b:" + session_digest(value).hex()


def session_digest(key: str) -> bytes:
    """Fixed-size stand-in for a session key of any length."""
    return blake2b(key.encode("utf-8", "surrogatepass"), digest_size=DIGEST_BYTES).digest()


class SessionTable:
    """Bounded LRU: digest of a session key → instance id of its last request."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._last: OrderedDict[bytes, str] = OrderedDict()

    def get(self, key: str) -> str | None:
        return self._last.get(session_digest(key))

    def put(self, key: str, instance_id: str) -> None:
        digest = session_digest(key)
        self._last[digest] = instance_id
        self._last.move_to_end(digest)
        if len(self._last) > self.capacity:
            self._last.popitem(last=False)

    def __len__(self) -> int:
        return len(self._last)
