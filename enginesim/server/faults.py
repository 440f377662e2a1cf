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
``/admin/*`` paths are never affected.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

FAULT_MODES = ("kill", "hang", "slow", "error5xx", "poison", "drop_midstream", "recover")


class FaultError(ValueError):
    """A fault request that does not make sense."""


@dataclass(frozen=True, slots=True)
class FaultRequest:
    mode: str
    factor: float = 1.0
    after_chunks: int = 2
    match: str = ""

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
        return cls(mode, float(factor), after_chunks, match if mode == "poison" else "")

    @classmethod
    def from_cli(cls, spec: str) -> tuple[int, FaultRequest]:
        """``INDEX:MODE[:FACTOR]`` as given to ``--fault``."""
        parts = spec.split(":")
        if len(parts) not in (2, 3) or not parts[0].isdigit():
            raise FaultError(f"--fault must be INDEX:MODE[:FACTOR], got {spec!r}")
        body: dict[str, Any] = {"mode": parts[1]}
        if len(parts) == 3:
            body["factor" if parts[1] == "slow" else "after_chunks"] = (
                float(parts[2]) if parts[1] == "slow" else int(parts[2])
            )
        return int(parts[0]), cls.from_json(body)


class FaultState:
    """Current fault of an instance, read by the request path."""

    def __init__(self) -> None:
        self.mode = "none"
        self.factor = 1.0
        self.after_chunks = 2
        self.match = b""
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

    def set(self, request: FaultRequest) -> None:
        self.mode = "none" if request.mode == "recover" else request.mode
        self.factor = request.factor if request.mode == "slow" else 1.0
        self.after_chunks = request.after_chunks
        self.match = request.match.encode()
        if self.hung:
            self._not_hung.clear()
        else:
            self._not_hung.set()

    async def wait_not_hung(self) -> None:
        if not self._not_hung.is_set():
            await self._not_hung.wait()

    def as_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "factor": self.factor, "after_chunks": self.after_chunks,
                "match": self.match.decode()}
