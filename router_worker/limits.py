"""Bounded concurrency with a bounded FIFO queue: overload is refused, never piled up;
and the deadline for a request body (see :class:`BodyDeadline`).

``max_concurrency`` requests run; up to ``max_queue`` more wait (FIFO) for at most
``queue_timeout_s``. A full queue answers 429 at once; a wait that times out answers
503. A released slot is handed straight to the oldest waiter.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from router_worker.errors import APIError

Receive = Callable[[], Awaitable[dict[str, Any]]]


class Limiter:
    def __init__(self, max_concurrency: int, max_queue: int, queue_timeout_s: float) -> None:
        self.max_concurrency = max_concurrency
        self.max_queue = max_queue
        self.queue_timeout_s = queue_timeout_s
        self.active = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def queued(self) -> int:
        return len(self._waiters)

    def configure(self, max_concurrency: int, max_queue: int, queue_timeout_s: float) -> None:
        self.max_concurrency, self.max_queue = max_concurrency, max_queue
        self.queue_timeout_s = queue_timeout_s

    async def acquire(self) -> None:
        if self.active < self.max_concurrency and not self._waiters:
            self.active += 1
            return
        if len(self._waiters) >= self.max_queue:
            raise APIError(429, "The router is overloaded: too many requests queued; retry later.")
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), self.queue_timeout_s)
        except TimeoutError:
            if waiter.done():  # handed over just as the wait ran out: keep the slot
                return
            waiter.cancel()
            self._forget(waiter)
            raise APIError(503, "The router is overloaded: timed out waiting for a slot.") from None
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()
            else:
                waiter.cancel()
                self._forget(waiter)
            raise

    def release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes to the waiter; active unchanged
                return
        self.active -= 1

    def _forget(self, waiter: asyncio.Future[None]) -> None:
        with contextlib.suppress(ValueError):
            self._waiters.remove(waiter)


class BodyDeadline:
    """A request's ``receive`` with a total deadline for the body (slowloris).

    Until the body is complete, each wait is bounded by the deadline fixed when the
    handler starts; past it the reader gets ``APIError`` 408 that closes the connection
    (a client dripping its body is not kept alive either). After the body (or a
    disconnect) messages pass straight through: the disconnect watcher waits on them for
    as long as the answer takes."""

    __slots__ = ("_deadline", "_done", "_on_expired", "_receive", "_timeout")

    def __init__(self, receive: Receive, timeout: float, on_expired: Callable[[], None]) -> None:
        self._receive = receive
        self._timeout = timeout
        self._deadline = asyncio.get_running_loop().time() + timeout
        self._on_expired = on_expired
        self._done = False

    async def __call__(self) -> dict[str, Any]:
        if self._done:
            return await self._receive()
        try:
            async with asyncio.timeout_at(self._deadline):
                message = await self._receive()
        except TimeoutError:
            self._done = True
            self._on_expired()
            raise APIError(408, f"The request body did not arrive within {self._timeout:g} s "
                                "(router.body_timeout_s).", close=True) from None
        if message["type"] != "http.request" or not message.get("more_body", False):
            self._done = True
        return message
