"""Runs one EngineCore in real time on the asyncio loop.

Virtual (simulated) time = wall seconds elapsed / wall_per_virtual, where
wall_per_virtual starts at ``--time-scale`` and a ``slow`` fault multiplies it.
The driver task advances the engine to "now", hands each request's new tokens
to its ``RequestStream`` (KV events reach the publisher from inside the engine),
then sleeps until the engine's next event (a new request wakes it early).

The engine's ``next_event_time`` skips over decode-only stretches, so while
requests are in flight the driver also wakes once per observed decode step:
tokens then reach clients at their step's end, not in one burst per stretch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from enginesim.server.metrics import ServerMetrics

log = logging.getLogger(__name__)

# Never sleep less than this (wall seconds): steps that fall due within it are
# processed together, which bounds CPU use when the simulated GPU is very fast.
MIN_WALL_SLEEP = 0.0005
# Decode step length assumed (simulated seconds) until one has been observed.
DEFAULT_TOKEN_PERIOD = 0.01
# Wake this fraction of a step after the predicted step end: a step that runs a
# little longer than the last one is still caught on the first wake.
STEP_SLACK = 0.02


def _log_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("engine driver stopped", exc_info=task.exception())


class VirtualClock:
    """Simulated seconds since start; the wall/virtual ratio can change on the fly."""

    def __init__(self, wall_per_virtual: float, wall: Callable[[], float] = time.monotonic):
        if wall_per_virtual <= 0:
            raise ValueError("time scale must be positive")
        self._wall = wall
        self._wall_anchor = wall()
        self._virtual_anchor = 0.0
        self.wall_per_virtual = wall_per_virtual

    def now(self) -> float:
        return self._virtual_anchor + (self._wall() - self._wall_anchor) / self.wall_per_virtual

    def set_wall_per_virtual(self, wall_per_virtual: float) -> None:
        self._virtual_anchor = self.now()
        self._wall_anchor = self._wall()
        self.wall_per_virtual = wall_per_virtual

    def wall_delay(self, virtual_delay: float) -> float:
        return virtual_delay * self.wall_per_virtual


class RequestStream:
    """What the HTTP handler of one request sees of it; updated by the driver."""

    __slots__ = (
        "_waiter",
        "arrival",
        "finish_reason",
        "finished",
        "first_token_time",
        "last_token_time",
        "max_tokens",
        "natural_stop",
        "num_cached_tokens",
        "num_output_tokens",
        "prompt_len",
        "req_id",
    )

    def __init__(
        self, req_id: str, prompt_len: int, max_tokens: int, natural_stop: bool, now: float
    ) -> None:
        self.req_id = req_id
        self.prompt_len = prompt_len
        self.max_tokens = max_tokens
        # True when max_tokens is our synthetic answer length, not the client's limit.
        self.natural_stop = natural_stop
        self.arrival = now
        self.num_output_tokens = 0
        self.num_cached_tokens = 0
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None
        self.finished = False
        self.finish_reason: str | None = None
        self._waiter: asyncio.Future[None] | None = None

    def notify(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait_beyond(self, seen_tokens: int) -> None:
        """Return once more than ``seen_tokens`` tokens exist or the request finished."""
        while self.num_output_tokens <= seen_tokens and not self.finished:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter

    async def wait_finished(self) -> None:
        while not self.finished:
            await self.wait_beyond(self.num_output_tokens)


class EngineDriver:
    """Owns the real-time loop around one engine core."""

    def __init__(self, engine: Any, clock: VirtualClock, metrics: ServerMetrics) -> None:
        self.engine = engine
        self.clock = clock
        self.metrics = metrics
        self._streams: dict[str, RequestStream] = {}
        self._token_period = DEFAULT_TOKEN_PERIOD
        self._last_token_at = 0.0
        self._wakeup: asyncio.Future[None] | None = None
        self._on_landed: dict[str, Callable[[], None]] = {}  # remote prefills being read
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())
        self._task.add_done_callback(_log_crash)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def submit(
        self,
        req_id: str,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        natural_stop: bool = False,
        output_token_ids: Sequence[int] | np.ndarray | None = None,
        hold_kv: bool = False,
        on_landed: Callable[[], None] | None = None,
    ) -> RequestStream:
        """Add a request to the engine now; raises the engine's request error.
        ``output_token_ids``: the answer's token ids, so its blocks get cached. ``hold_kv``:
        a prefill whose blocks are held for a remote decode. ``on_landed``: the request is
        a remote prefill, read over the link first; called once the read has landed."""
        now = self.clock.now()
        self._step(now)
        self.engine.add_request(
            req_id,
            list(prompt_token_ids),
            max_tokens,
            now,
            output_token_ids=output_token_ids,
            hold_kv=hold_kv,
            remote_prefill=on_landed is not None,
        )
        if on_landed is not None:
            self._on_landed[req_id] = on_landed
        stream = RequestStream(req_id, len(prompt_token_ids), max_tokens, natural_stop, now)
        self._streams[req_id] = stream
        self.wake()
        return stream

    def abort(self, stream: RequestStream) -> None:
        """The client went away: drop the request from the engine, count it as aborted."""
        if stream.finished:
            return
        now = self.clock.now()
        self._streams.pop(stream.req_id, None)
        self._on_landed.pop(stream.req_id, None)
        self.engine.abort(stream.req_id, now)
        self._finish(stream, "abort", now)
        self.wake()

    def abort_all(self) -> None:
        for stream in list(self._streams.values()):
            self.abort(stream)

    def wake(self) -> None:
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            now = self.clock.now()
            self._step(now)
            next_time = self._next_wake(now)
            self._wakeup = loop.create_future()
            timer = None
            if next_time is not None:
                delay = max(self.clock.wall_delay(next_time - now), MIN_WALL_SLEEP)
                timer = loop.call_later(delay, self.wake)
            await self._wakeup
            if timer is not None:
                timer.cancel()

    def _next_wake(self, now: float) -> float | None:
        next_time = self.engine.next_event_time()
        if not self._streams or next_time is None:
            return next_time
        step_end = self._last_token_at + self._token_period * (1 + STEP_SLACK)
        if step_end <= now:  # no token at the predicted time: poll once a step
            step_end = now + self._token_period
        return min(next_time, step_end)

    def advance(self) -> float:
        """Bring the engine to now (before asking it what it holds); returns now."""
        now = self.clock.now()
        self._step(now)
        return now

    def _step(self, now: float) -> None:
        for output in self.engine.advance_to(now):
            stream = self._streams.get(output.req_id)
            if stream is not None:
                self._apply(stream, output, now)
        if self._on_landed:
            for req_id, num_bytes, seconds in self.engine.take_landed():
                self.metrics.observe_transfer(num_bytes, seconds)
                landed = self._on_landed.pop(req_id, None)
                if landed is not None:
                    landed()

    def _apply(self, stream: RequestStream, output: Any, now: float) -> None:
        new_tokens = output.num_output_tokens - stream.num_output_tokens
        if new_tokens > 0:
            self._record_tokens(stream, output, new_tokens, now)
        if output.finished:
            self._streams.pop(stream.req_id, None)
            self._on_landed.pop(stream.req_id, None)
            end = output.finish_time if output.finish_time is not None else now
            self._finish(stream, self._finish_reason(stream, output), end)
        else:
            stream.notify()

    def _record_tokens(
        self, stream: RequestStream, output: Any, new_tokens: int, now: float
    ) -> None:
        last = output.last_token_time if output.last_token_time is not None else now
        if stream.first_token_time is None:
            first = output.first_token_time if output.first_token_time is not None else last
            stream.first_token_time = first
            stream.last_token_time = first
            stream.num_cached_tokens = output.num_cached_tokens
            stream.arrival = output.arrival_time
            self.metrics.observe_first_token(first - stream.arrival, stream.prompt_len)
            new_tokens -= 1
        if new_tokens > 0:
            # Tokens delivered together are spread evenly over the time they took.
            assert stream.last_token_time is not None  # set with the first token
            interval = last - stream.last_token_time
            self.metrics.observe_decode(interval, new_tokens)
            if interval > 0:
                self._token_period = interval / new_tokens
            stream.last_token_time = last
        self._last_token_at = max(self._last_token_at, last)
        stream.num_output_tokens = output.num_output_tokens

    @staticmethod
    def _finish_reason(stream: RequestStream, output: Any) -> str:
        reason = output.finish_reason or "length"
        if reason == "length" and stream.natural_stop:
            return "stop"
        return reason

    def _finish(self, stream: RequestStream, reason: str, now: float) -> None:
        stream.finished = True
        stream.finish_reason = reason
        first = stream.first_token_time if stream.first_token_time is not None else now
        self.metrics.observe_finished(
            reason,
            e2e=now - stream.arrival,
            prompt_tokens=stream.prompt_len,
            generation_tokens=stream.num_output_tokens,
            max_tokens=None if stream.natural_stop else stream.max_tokens,
            decode_time=now - first,
        )
        stream.notify()
