"""Bounded concurrency with a bounded FIFO queue: overload is refused, never piled up.

``max_concurrency`` requests run; up to ``max_queue`` more wait (FIFO) for at most
``queue_timeout_s``. A full queue answers 429 at once; a wait that times out answers
503. A released slot is handed straight to the oldest waiter.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

from router_worker.errors import APIError


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
