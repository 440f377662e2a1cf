"""The load generator's asyncio core: timed sends, streaming measurement, bursts, stop.

Each record is sent at ``start + arrival`` (wall clock; arrivals already divided by the
rate scale). At most ``concurrency_limit`` requests are in flight: a record whose time
comes while the limit is reached waits, and its lateness is reported (the generator never
queues unboundedly and never drops silently). TTFT is send → first non-empty content
chunk; TPOT = (last content chunk − first) / (completion tokens − 1), both measured here.

A hot-prefix burst (``BurstSettings``) is generated when triggered — by SIGUSR1, or
``at_s`` seconds after the start — and scheduled from the trigger time on.
``stop()`` (Ctrl-C) stops scheduling, cancels in-flight requests (closing their
streams) and returns what was measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import httpx

from enginesim.loadgen.payloads import PayloadBuilder
from enginesim.replay.synth import BurstParams, hotspot_burst
from enginesim.replay.traces import TraceRecord


@dataclass
class Outcome:
    id: str
    kind: str  # trace | burst
    scheduled_s: float
    sent_s: float
    status: str = "pending"  # ok | error | cancelled
    error: str | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    output_tokens: int = 0
    end_s: float | None = None
    target: str | None = None  # base URL that served it (several targets: round-robin)


@dataclass(frozen=True)
class BurstSettings:
    params: BurstParams  # at_s is ignored: the trigger decides when
    at_s: float | None = None  # trigger this long after the start (None: SIGUSR1 only)


@dataclass
class _Stream:
    first: float | None = None
    last: float | None = None
    chunks: int = 0
    usage: dict[str, Any] | None = None
    error: str | None = None


class LoadGenerator:
    def __init__(
        self,
        records: Sequence[TraceRecord],
        target: str | Sequence[str],
        model: str,
        *,
        concurrency_limit: int = 256,
        timeout_s: float = 600.0,
        loop: bool = False,
        max_requests: int | None = None,
        duration_s: float | None = None,
        burst: BurstSettings | None = None,
        on_progress: Callable[[LoadGenerator], None] | None = None,
    ) -> None:
        if concurrency_limit < 1:
            raise ValueError("concurrency_limit must be >= 1")
        if loop and not records:
            raise ValueError("--loop needs a non-empty trace")
        targets = [target] if isinstance(target, str) else list(target)
        if not targets:
            raise ValueError("at least one target is needed")
        self.records = list(records)
        # Several targets (routers behind a load balancer): requests go round-robin.
        self.targets = [t.rstrip("/") for t in targets]
        self.target = self.targets[0]
        self.payloads = PayloadBuilder(model)
        self.limit = asyncio.Semaphore(concurrency_limit)
        self.timeout_s, self.loop, self.max_requests = timeout_s, loop, max_requests
        self.duration_s, self.burst, self.on_progress = duration_s, burst, on_progress
        self.outcomes: list[Outcome] = []
        self.in_flight: set[asyncio.Task[None]] = set()
        self.stopping = asyncio.Event()
        self.burst_trigger = asyncio.Event()
        self.schedulers: set[asyncio.Task[None]] = set()
        self.start = 0.0
        self.bursts = 0

    # ----------------------------------------------------------------- control

    def stop(self) -> None:
        self.stopping.set()

    def trigger_burst(self) -> None:
        self.burst_trigger.set()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    async def run(self) -> list[Outcome]:
        """Send everything (or until stopped/bounded); returns one outcome per send."""
        self.start = time.monotonic()
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        async with httpx.AsyncClient(
            timeout=httpx.Timeout(self.timeout_s, connect=10.0), limits=limits
        ) as client:
            helpers = [asyncio.create_task(self._progress_loop())]
            if self.burst is not None:
                helpers.append(asyncio.create_task(self._burst_loop(client)))
            try:
                await self._schedule(client, self._trace_schedule(), "trace")
                if self.burst is not None and self.burst.at_s is not None and not self.bursts:
                    await self._wait_until(self.burst.at_s)  # a timed burst still fires
                await self._drain()
            finally:
                for task in helpers:
                    task.cancel()
                await self._cancel_in_flight()
        return self.outcomes

    # ----------------------------------------------------------------- scheduling

    def _trace_schedule(self) -> Iterator[tuple[float, TraceRecord]]:
        span = self.records[-1].arrival_s + 1.0 if self.records else 0.0
        repeat = 0
        while True:
            for record in self.records:
                yield (
                    repeat * span + record.arrival_s,
                    replace(record, session_id=_looped(record.session_id, repeat)),
                )
            repeat += 1
            if not self.loop:
                return

    async def _schedule(
        self, client: httpx.AsyncClient, schedule: Iterator[tuple[float, TraceRecord]], kind: str
    ) -> None:
        for offset, record in schedule:
            if not await self._wait_until(offset) or self._bounded():
                return
            await self.limit.acquire()
            if self.stopping.is_set():
                self.limit.release()
                return
            outcome = Outcome(
                f"{kind}-{len(self.outcomes)}",
                kind,
                offset,
                self.elapsed(),
                target=self.targets[len(self.outcomes) % len(self.targets)],
            )
            self.outcomes.append(outcome)
            task = asyncio.create_task(self._send(client, record, outcome))
            self.in_flight.add(task)
            task.add_done_callback(self._done)

    def _bounded(self) -> bool:
        if self.max_requests is not None and len(self.outcomes) >= self.max_requests:
            return True
        return self.duration_s is not None and self.elapsed() >= self.duration_s

    async def _wait_until(self, offset: float) -> bool:
        """Sleep until ``offset`` s after the start; False if stopped meanwhile."""
        delay = offset - self.elapsed()
        if delay > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), delay)
        return not self.stopping.is_set()

    def _done(self, task: asyncio.Task[None]) -> None:
        self.in_flight.discard(task)
        self.limit.release()

    async def _drain(self) -> None:
        """Wait for burst schedules and in-flight requests, or for a stop."""
        while (self.in_flight or self.schedulers) and not self.stopping.is_set():
            stop = asyncio.create_task(self.stopping.wait())
            await asyncio.wait(
                {*self.in_flight, *self.schedulers, stop}, return_when=asyncio.FIRST_COMPLETED
            )
            stop.cancel()

    async def _cancel_in_flight(self) -> None:
        tasks = [*self.schedulers, *self.in_flight]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _burst_loop(self, client: httpx.AsyncClient) -> None:
        assert self.burst is not None
        if self.burst.at_s is not None:
            asyncio.get_running_loop().call_later(self.burst.at_s, self.trigger_burst)
        while not self.stopping.is_set():
            await self.burst_trigger.wait()
            self.burst_trigger.clear()
            now = self.elapsed()
            params = replace(self.burst.params, at_s=now, seed=self.burst.params.seed + self.bursts)
            self.bursts += 1
            burst = hotspot_burst(self.records, params)
            mine = [(r.arrival_s, r) for r in burst if r.kind == "hotspot"]
            scheduler = asyncio.create_task(self._schedule(client, iter(mine), "burst"))
            self.schedulers.add(scheduler)
            scheduler.add_done_callback(self.schedulers.discard)

    async def _progress_loop(self) -> None:
        while self.on_progress is not None:
            self.on_progress(self)
            await asyncio.sleep(0.5)

    # ----------------------------------------------------------------- one request

    async def _send(self, client: httpx.AsyncClient, record: TraceRecord, outcome: Outcome) -> None:
        path, body = self.payloads.build(record)
        sent = time.monotonic()
        stream = _Stream()
        try:
            target = outcome.target or self.target
            async with client.stream("POST", target + path, json=body) as response:
                if response.status_code != 200:
                    text = (await response.aread()).decode(errors="replace")
                    stream.error = f"HTTP {response.status_code}: {text[:200]}"
                else:
                    await _read_events(response, stream)
        except asyncio.CancelledError:
            outcome.status, outcome.end_s = "cancelled", self.elapsed()
            raise
        except httpx.HTTPError as exc:
            stream.error = f"{type(exc).__name__}: {exc}"
        _finish(outcome, stream, sent, self.elapsed())


async def _read_events(response: httpx.Response, stream: _Stream) -> None:
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        chunk = json.loads(data)
        if "error" in chunk:
            stream.error = str(chunk["error"].get("message", chunk["error"]))
            return
        if chunk.get("usage"):
            stream.usage = chunk["usage"]
        if any(_content(choice) for choice in chunk.get("choices") or ()):
            now = time.monotonic()
            stream.first = stream.first or now
            stream.last = now
            stream.chunks += 1


def _content(choice: dict[str, Any]) -> str:
    return choice.get("text") or (choice.get("delta") or {}).get("content") or ""


def _finish(outcome: Outcome, stream: _Stream, sent: float, end: float) -> None:
    outcome.end_s = end
    usage = stream.usage or {}
    outcome.output_tokens = int(usage.get("completion_tokens") or stream.chunks)
    outcome.prompt_tokens = usage.get("prompt_tokens")
    outcome.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if stream.error is not None or stream.first is None:
        outcome.status, outcome.error = "error", stream.error or "no content received"
        return
    outcome.status = "ok"
    outcome.ttft_s = stream.first - sent
    if outcome.output_tokens > 1 and stream.last is not None:
        outcome.tpot_s = (stream.last - stream.first) / (outcome.output_tokens - 1)


def _looped(session_id: str | None, repeat: int) -> str | None:
    """Each pass of --loop is a new set of sessions (same prompts, new conversations)."""
    return session_id if session_id is None or repeat == 0 else f"{session_id}~{repeat}"
