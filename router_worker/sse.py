"""An engine's SSE stream, checked before it reaches the client.

The router relays an engine's stream chunk by chunk; an engine (or something between it
and the router) that sends garbage would otherwise hand the client a stream its SDK
cannot parse. :class:`SseFramer` passes on *whole events only*, each well-formed: lines
are ``data:`` (a JSON object or ``[DONE]``), comments (``:``), ``event:``, ``id:`` or
``retry:``. An incomplete last event is held back until its end arrives (engines write
one whole event at a time, so this costs nothing in practice), and so a stream that
fails midway ends cleanly with the router's error event instead of half an event. An
event still unterminated after ``max_event_bytes`` is refused: nothing grows without
bound in the router's memory.

The check is by shape (first and last byte of a data line), not a JSON parse: the
relay is on the hot path, and the shape tells garbage (an HTML page, binary noise, a
truncated line) from vLLM's events.
"""

from __future__ import annotations

DONE = b"[DONE]"
DONE_EVENT = b"data: " + DONE + b"\n\n"
_OTHER_FIELDS = (b"event", b"id", b"retry")


class MalformedStream(Exception):
    """The engine's stream is not well-formed SSE; ``limit`` names the rule broken."""

    def __init__(self, message: str, limit: str = "bad_response") -> None:
        super().__init__(message)
        self.limit = limit


class SseFramer:
    __slots__ = ("_tail", "max_event_bytes")

    def __init__(self, max_event_bytes: int) -> None:
        self.max_event_bytes = max_event_bytes
        self._tail = b""

    def feed(self, chunk: bytes) -> bytes:
        """The complete, checked events in what has arrived so far (maybe b"")."""
        if not self._tail and _one_json_event(chunk):
            return chunk  # the usual chunk: exactly one event
        data = self._tail + chunk if self._tail else chunk
        end = _end_of_last_event(data)
        complete, self._tail = (b"", data) if end < 0 else (data[:end], data[end:])
        if len(self._tail) > self.max_event_bytes:
            raise MalformedStream(
                f"an event of the engine's stream is over "
                f"{self.max_event_bytes} bytes (router.max_event_bytes)",
                "event_too_large",
            )
        if complete:
            check_events(complete)
        return complete

    def finish(self) -> bytes:
        """At the end of the stream: its last event if it lacked the closing blank line."""
        tail, self._tail = self._tail, b""
        if not tail.strip():
            return b""
        check_events(tail)
        return tail.rstrip(b"\r\n") + b"\n\n"


def _one_json_event(chunk: bytes) -> bool:
    return (
        chunk.startswith(b"data: {") and chunk.endswith(b"}\n\n") and chunk.count(b"\n") == 2
    ) or chunk == b"data: [DONE]\n\n"


def _end_of_last_event(data: bytes) -> int:
    """Index just past the last blank line (``\\n\\n`` or ``\\n\\r\\n``), or -1."""
    lf = data.rfind(b"\n\n")
    crlf = data.rfind(b"\n\r\n")
    return max(lf + 2 if lf >= 0 else -1, crlf + 3 if crlf >= 0 else -1)


def check_events(data: bytes) -> None:
    """Raise MalformedStream unless every line of ``data`` is a valid SSE line."""
    for raw in data.split(b"\n"):
        line = raw.rstrip(b"\r")
        if not line or line.startswith(b":"):
            continue
        if line.startswith(b"data:"):
            payload = line[5:].strip()
            if payload == DONE or (payload.startswith(b"{") and payload.endswith(b"}")):
                continue
            raise MalformedStream(
                f"the engine sent an event whose data is not a JSON object: {line[:60]!r}"
            )
        if line.split(b":", 1)[0] not in _OTHER_FIELDS:
            raise MalformedStream(f"the engine sent a line that is not SSE: {line[:60]!r}")
