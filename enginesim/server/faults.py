"""Fault knobs of one instance, for failure drills.

Modes (one at a time; ``recover`` returns to ``none``):
- ``kill``: the port stops accepting; in-flight connections are cut. ``recover``
  restarts the instance like a process restart: empty KV cache (an
  ``AllBlocksCleared`` event is published), fresh metrics.
- ``hang``: connections are accepted, nothing is answered (in-flight streams
  freeze too) until ``recover``. The engine keeps running.
- ``slow``: the simulated hardware runs ``factor`` times slower (factor > 1).
- ``error5xx``: every API request and ``/health`` answer 500 with an OpenAI-style
  error body.
- ``poison``: API requests whose body contains the ``match`` text answer 500 (an engine
  bug one input triggers); every other request and ``/health`` are served.
- ``drop_midstream``: streamed responses are cut after ``after_chunks`` SSE
  chunks (default 2), non-streamed ones after their headers; the engine request
  is aborted as on a client disconnect.
- ``garbage``: streamed responses carry a chunk of non-SSE garbage in place of SSE
  chunk number ``after_chunks`` (default 2; 0 = the first); non-streamed bodies are
  not JSON. Status and content type stay right (a broken engine or a mangling proxy).
- ``wrong_content_type``: API requests are answered 200 with an HTML page
  (``text/html``), like a misconfigured proxy or captive portal; ``/health`` is served.
- ``drip``: every SSE chunk waits ``period`` seconds (default 0.5) before it is sent,
  and a non-streamed body goes out in 16-byte pieces ``period`` apart: an engine that
  never falls silent long enough to trip a read timeout, yet never finishes.
``/admin/*`` paths are never affected.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

FAULT_MODES = (
    "kill",
    "hang",
    "slow",
    "error5xx",
    "poison",
    "drop_midstream",
    "garbage",
    "wrong_content_type",
    "drip",
    "recover",
)
# A data line an SSE client would hand to its JSON parser, then binary noise.
GARBAGE = b"data: <html><body><h1>502 Bad Gateway</h1></body></html>\n\n\x00\xff garbled\n\n"


class FaultError(ValueError):
    """A fault request that does not make sense."""


@dataclass(frozen=True, slots=True)
class FaultRequest:
    mode: str
    factor: float = 1.0
    after_chunks: int = 2
    match: str = ""
    period: float = 0.5

    @classmethod
    def from_json(cls, body: Any) -> FaultRequest:
        if not isinstance(body, dict):
            raise FaultError("body must be a JSON object")
        mode = body.get("mode")
        if mode not in FAULT_MODES:
            raise FaultError(f"mode must be one of {FAULT_MODES}")
        factor = body.get("factor", 1.0 if mode != "slow" else 10.0)
        after_chunks = body.get("after_chunks", 2)
        if not isinstance(factor, int | float) or factor <= 0:
            raise FaultError("factor must be a positive number")
        if not isinstance(after_chunks, int) or after_chunks < 0:
            raise FaultError("after_chunks must be a non-negative integer")
        match = body.get("match", "")
        if mode == "poison" and (not isinstance(match, str) or not match):
            raise FaultError("poison needs `match`: a non-empty text")
        period = body.get("period", 0.5)
        if isinstance(period, bool) or not isinstance(period, int | float) or not 0 < period <= 600:
            raise FaultError("period must be a number of seconds in (0, 600]")
        return cls(
            mode, float(factor), after_chunks, match if mode == "poison" else "", float(period)
        )

    @classmethod
    def from_cli(cls, spec: str) -> tuple[int, FaultRequest]:
        """``INDEX:MODE[:FACTOR]`` as given to ``--fault``."""
        parts = spec.split(":")
        if len(parts) not in (2, 3) or not parts[0].isdigit():
            raise FaultError(f"--fault must be INDEX:MODE[:FACTOR], got {spec!r}")
        body: dict[str, Any] = {"mode": parts[1]}
        if len(parts) == 3:
            try:
                if parts[1] in ("slow", "drip"):
                    body["factor" if parts[1] == "slow" else "period"] = float(parts[2])
                else:
                    body["after_chunks"] = int(parts[2])
            except ValueError:
                raise FaultError(f"--fault argument must be a number, got {spec!r}") from None
        return int(parts[0]), cls.from_json(body)


class FaultState:
    """Current fault of an instance, read by the request path."""

    def __init__(self) -> None:
        self.mode = "none"
        self.factor = 1.0
        self.after_chunks = 2
        self.match = b""
        self.period = 0.5
        self._not_hung = asyncio.Event()
        self._not_hung.set()

    @property
    def killed(self) -> bool:
        return self.mode == "kill"

    @property
    def failing(self) -> bool:
        return self.mode == "error5xx"

    def poisoned_by(self, body: bytes) -> bool:
        """Whether a request with this raw body fails under the ``poison`` fault."""
        return self.mode == "poison" and self.match in body

    @property
    def dropping(self) -> bool:
        return self.mode == "drop_midstream"

    @property
    def hung(self) -> bool:
        return self.mode == "hang"

    @property
    def garbling(self) -> bool:
        return self.mode == "garbage"

    @property
    def dripping(self) -> bool:
        return self.mode == "drip"

    def set(self, request: FaultRequest) -> None:
        self.mode = "none" if request.mode == "recover" else request.mode
        self.factor = request.factor if request.mode == "slow" else 1.0
        self.after_chunks = request.after_chunks
        self.match = request.match.encode()
        self.period = request.period
        if self.hung:
            self._not_hung.clear()
        else:
            self._not_hung.set()

    async def wait_not_hung(self) -> None:
        if not self._not_hung.is_set():
            await self._not_hung.wait()

    def as_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "factor": self.factor,
            "after_chunks": self.after_chunks,
            "match": self.match.decode(),
            "period": self.period,
        }
