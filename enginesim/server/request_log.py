"""``--request-log``: one JSON line per request with the engine's own view of its timing.

What vLLM gives as per-request trace spans (queue time, time to first token) in a form a
benchmark can join with its client-side timings: the times are ``time.monotonic()``
(CLOCK_MONOTONIC, the same clock in every process on the host), taken where the HTTP
handler starts and where the first content chunk is handed to the server. A client that
sets ``X-Request-Id`` finds its id in ``request_id`` (after vLLM's ``cmpl-``/``chatcmpl-``),
and one that sends a ``traceparent`` finds it in ``traceparent``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(slots=True)
class RequestTiming:
    request_id: str
    instance: int
    stream: bool
    arrival: float  # monotonic s: the handler started (body read, before parsing)
    first_token: float | None = None  # monotonic s: first content chunk handed to the server
    finished: float | None = None  # monotonic s: last byte handed to the server
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    completed: bool = False  # False: aborted (client gone, fault) before the end
    # the W3C trace context the request came with (vLLM parents its own spans on it)
    traceparent: str | None = None


class RequestLog:
    """Appends :class:`RequestTiming` records, a line each, flushed per line."""

    def __init__(self, path: str | Path) -> None:
        # Open for the server's lifetime (closed by ``close``), not per record.
        self._file = Path(path).open("a", buffering=1, encoding="utf-8")  # noqa: SIM115

    def write(self, timing: RequestTiming) -> None:
        if not self._file.closed:
            self._file.write(json.dumps(asdict(timing), separators=(",", ":")) + "\n")

    def close(self) -> None:
        self._file.close()
