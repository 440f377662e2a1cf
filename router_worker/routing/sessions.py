"""Session features derived statelessly from a request (SMetric: docs/algorithms.md).

* ``turn_index_from_messages``: in a chat request, the number of earlier
  assistant messages; 0 means a first turn.
* ``session_key_from_request``: the first of, in order (each source can be switched off
  per cluster: the routing document's ``session_sources``),

  1. ``header``: the ``X-Session-ID`` header (case-insensitive; OpenCode sends it too);
  2. ``harness``: the session headers agent harnesses send without being asked
     (:data:`HARNESS_HEADERS`: Dynamo's canonical ``X-Dynamo-Session-ID``, Claude Code's
     ``X-Claude-Code-Agent-ID`` (a subagent's own) and ``X-Claude-Code-Session-ID``,
     Codex's ``session-id``/``session_id``);
  3. ``response_chain``: a Responses request's ``previous_response_id`` chain, keyed by
     the chain's first response (:class:`ResponseChains`);
  4. ``user``: the body's ``user`` (a Messages request's ``metadata.user_id``);

  else None. A value over ``MAX_KEY_CHARS`` is replaced by its digest.

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
from dataclasses import dataclass
from hashlib import blake2b
from typing import Any, Literal

# 128 bits: two different session keys colliding is out of reach (birthday bound 2**64).
DIGEST_BYTES = 16
# A longer session value (``user``, ``X-Session-ID``) is replaced by its digest where it is
# read, so no copy of it outlives the request, nor is it hashed more than once.
MAX_KEY_CHARS = 256


def turn_index_from_messages(messages: Iterable[Mapping[str, Any]]) -> int:
    """Number of assistant messages before the request's own reply."""
    return sum(1 for message in messages if message.get("role") == "assistant")


SessionSource = Literal["header", "harness", "response_chain", "user"]
SESSION_SOURCES: tuple[SessionSource, ...] = ("header", "harness", "response_chain", "user")
# Agent harnesses' own session headers, most specific first (a Claude Code subagent's
# agent id before its root session's id).
HARNESS_HEADERS = (
    "x-dynamo-session-id",
    "x-claude-code-agent-id",
    "x-claude-code-session-id",
    "session-id",
    "session_id",
)


def session_key_from_request(
    headers: Mapping[str, str],
    body: Mapping[str, Any],
    sources: Iterable[SessionSource] = SESSION_SOURCES,
    chain_root: str | None = None,
) -> str | None:
    """The request's session key from the first enabled source that has one (the module
    docstring's order, whatever the order of ``sources``); ``chain_root`` is the first
    response of the Responses chain the request extends."""
    enabled = frozenset(sources)
    given = {name.lower(): value for name, value in headers.items() if value}
    if "header" in enabled and given.get("x-session-id"):
        return f"hdr:{compact_key(given['x-session-id'])}"
    if "harness" in enabled:
        for name in HARNESS_HEADERS:
            if given.get(name):
                return f"agent:{compact_key(given[name])}"
    if "response_chain" in enabled and chain_root:
        return f"resp:{compact_key(chain_root)}"
    user = body.get("user")
    if "user" in enabled and isinstance(user, str) and user:
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


@dataclass(frozen=True, slots=True)
class ChainTurn:
    """A Responses answer the router saw: the chain it belongs to and the prompt that
    produced it (the prefix of every later turn's prompt: the engine renders the chain's
    history first)."""

    root: str  # the chain's first response id: its session
    turn: int  # 0 for the chain's first response
    block_hashes: tuple[int, ...]
    prompt_tokens: int
    arm: str = ""  # the canary arm that served it: the chain's next turns stay in it
    instance: str = ""  # the instance that answered it: it alone holds the chain's history


class ResponseChains:
    """Bounded LRU: digest of a Responses answer's id → its :class:`ChainTurn`. Filled from
    the engines' answers; a request naming a ``previous_response_id`` is routed on it (its
    session, its turn, the history's blocks), which the router cannot render itself."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._turns: OrderedDict[bytes, ChainTurn] = OrderedDict()

    def get(self, response_id: str) -> ChainTurn | None:
        return self._turns.get(session_digest(response_id))

    def put(self, response_id: str, turn: ChainTurn) -> None:
        digest = session_digest(response_id)
        self._turns[digest] = turn
        self._turns.move_to_end(digest)
        if len(self._turns) > self.capacity:
            self._turns.popitem(last=False)

    def __len__(self) -> int:
        return len(self._turns)
