"""Optional KV-events subscribers (vLLM ``ZmqEventPublisher``), one per instance.

Frames ``[topic, seq (8-byte big-endian), msgpack batch]``; both batch/event encodings are
decoded by :func:`router_worker.routing.decode_kv_event_batch`. A sequence gap (a batch
numbered beyond the next expected one: dropped by a slow-subscriber high-water mark, a
reconnect...) is recovered through the instance's replay socket when ``kv_replay`` is
configured: a DEALER sends ``[b"", start_seq]`` and receives ``[b"", seq, payload]``
frames up to the end marker (seq -1). A sequence that jumps *backwards* means the
publisher restarted: its cache is empty, so the instance's shadow index is cleared.

Note: the engine's token ids are translated into router block hashes by chaining our
hash over them (see :mod:`router_worker.routing.kvindex`), so events line up with the
router's own hashes only when the router tokenizes exactly like the engine (tier
``exact`` with the model's tokenizer.json, or token-id prompts).

Malformed messages (too few frames, a sequence frame that is not 8 bytes, a payload that is
not a KV event batch, or one the index cannot apply) are skipped and counted: per instance
and reason in ``/admin/state`` and the Prometheus counter
``switchyard_router_kv_events_malformed_total``, and in a ``kv_events_malformed`` telemetry
event (at most one per instance every ``REPORT_INTERVAL_S``, carrying the count). The
subscription stays up; a subscriber task that dies all the same is restarted and counted
(``crashes``, ``switchyard_router_kv_subscriber_crashes_total``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq
import zmq.asyncio

from engine_interface.kv_events import END_SEQ, SEQ_BYTES
from router_worker.contract.config import RouterConfig
from router_worker.routing import (
    AllBlocksCleared,
    KVEventBatch,
    KVEventDecodeError,
    decode_kv_event_batch,
)

log = logging.getLogger("router_worker.kv")

REPLAY_TIMEOUT_S = 1.0
RECONCILE_S = 1.0
REPORT_INTERVAL_S = 10.0

# (instance, reason, detail) of one malformed message
MalformedReport = Callable[[str, str, str], None]


def _ignore(instance: str, reason: str, detail: str) -> None:
    return None


@dataclass
class SubscriberStats:
    batches: int = 0
    gaps: int = 0
    recovered_batches: int = 0
    unrecovered_gaps: int = 0
    decode_errors: int = 0  # malformed messages skipped, all reasons
    malformed: dict[str, int] = field(default_factory=dict)  # per reason
    restarts: int = 0  # of the publisher (its sequence went backwards)
    crashes: int = 0  # of this subscriber task (restarted by KVSubscribers)
    checks: int = 0  # passes of KVSubscribers' reconcile that found the task running
    last_seq: int | None = None


class Subscriber:
    def __init__(
        self,
        core: Any,
        name: str,
        endpoint: str,
        replay: str | None,
        context: zmq.asyncio.Context,
        report: MalformedReport = _ignore,
        stats: SubscriberStats | None = None,
    ) -> None:
        self.core = core
        self.name = name
        self.endpoint = endpoint
        self.replay = replay
        self.context = context
        self.report = report
        self.stats = SubscriberStats() if stats is None else stats

    async def run(self) -> None:
        socket = self.context.socket(zmq.SUB)
        socket.setsockopt(zmq.SUBSCRIBE, b"")
        socket.setsockopt(zmq.LINGER, 0)
        socket.connect(self.endpoint)
        try:
            while True:
                frames = await socket.recv_multipart()
                seq = self.sequence(frames, 3)
                if seq is not None and seq < 0:  # vLLM counts from 0
                    self.malformed("sequence", f"negative sequence number {seq}")
                elif seq is not None:
                    await self.receive(seq, frames[-1])
        finally:
            socket.close(linger=0)

    def sequence(self, frames: list[bytes], least: int) -> int | None:
        """The sequence number of a well-framed message, else None (counted)."""
        if len(frames) < least:
            self.malformed("frames", f"{len(frames)} frames")
            return None
        if len(frames[-2]) != SEQ_BYTES:
            self.malformed("sequence", f"a {len(frames[-2])}-byte sequence frame")
            return None
        return int.from_bytes(frames[-2], "big", signed=True)

    def malformed(self, reason: str, detail: str) -> None:
        self.stats.decode_errors += 1
        self.stats.malformed[reason] = self.stats.malformed.get(reason, 0) + 1
        self.report(self.name, reason, detail)

    async def receive(self, seq: int, payload: bytes) -> None:
        expected = None if self.stats.last_seq is None else self.stats.last_seq + 1
        if expected is not None and seq > expected:
            self.stats.gaps += 1
            await self.recover(expected, seq)
        elif expected is not None and seq < expected:
            self.stats.restarts += 1  # the publisher restarted: its cache starts empty
            self.apply_batch(KVEventBatch(ts=time.time(), events=(AllBlocksCleared(),)))
        self.apply(payload)
        self.stats.last_seq = seq

    async def recover(self, start: int, stop: int) -> None:
        """Fetch batches [start, stop) from the replay socket and apply them in order."""
        if self.replay is None:
            self.stats.unrecovered_gaps += 1
            return
        socket = self.context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.connect(self.replay)
        try:
            await socket.send_multipart([b"", start.to_bytes(SEQ_BYTES, "big")])
            got = await asyncio.wait_for(self._collect(socket, stop), REPLAY_TIMEOUT_S)
        except (TimeoutError, zmq.ZMQError):
            got = -1
        finally:
            socket.close(linger=0)
        if got < stop - start:
            self.stats.unrecovered_gaps += 1

    async def _collect(self, socket: Any, stop: int) -> int:
        count = 0
        while True:
            frames = await socket.recv_multipart()
            seq = self.sequence(frames, 2)
            if seq == END_SEQ:
                return count
            if seq is not None and seq < 0:
                self.malformed("sequence", f"negative sequence number {seq} in a replay")
            elif seq is not None and seq < stop:
                self.apply(frames[-1])
                count += 1
                self.stats.recovered_batches += 1

    def apply(self, payload: bytes) -> None:
        try:
            batch = decode_kv_event_batch(payload)
        except KVEventDecodeError as error:
            self.malformed("decode", str(error))
            return
        self.apply_batch(batch)

    def apply_batch(self, batch: KVEventBatch) -> None:
        state = self.core.state
        if state is None or self.name not in state.ids:
            return
        try:
            state.on_kv_event_batch(self.name, batch, time.time())
        except (ValueError, TypeError, OverflowError) as error:
            # Decoded but not applicable (the decoder should have refused it): the batch
            # is skipped like any malformed one, never the subscription.
            log.exception("KV events from %s: batch not applied", self.name)
            self.malformed("apply", f"{type(error).__name__}: {error}")
            return
        self.stats.batches += 1


class MalformedReporter:
    """Counts malformed KV-event messages in Prometheus (per instance and reason) and sends
    a ``kv_events_malformed`` telemetry event per instance at most every
    ``REPORT_INTERVAL_S`` with the count since the previous one (a flood of garbage must
    not become a flood of events)."""

    def __init__(
        self, metrics: Any, telemetry: Any, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.metrics = metrics
        self.telemetry = telemetry
        self.clock = clock
        self.unreported: dict[str, tuple[int, dict[str, int], str]] = {}
        self.last_sent: dict[str, float] = {}

    def __call__(self, instance: str, reason: str, detail: str) -> None:
        self.metrics.child(self.metrics.kv_events_malformed, instance, reason).inc()
        count, reasons, _ = self.unreported.get(instance, (0, {}, ""))
        reasons[reason] = reasons.get(reason, 0) + 1
        self.unreported[instance] = (count + 1, reasons, f"{reason}: {detail[:200]}")
        log.debug(
            "KV events from %s: malformed message skipped (%s: %s)", instance, reason, detail[:200]
        )
        self.flush(only=instance)

    def flush(self, only: str | None = None) -> None:
        now = self.clock()
        for instance in [only] if only is not None else list(self.unreported):
            if now - self.last_sent.get(instance, -REPORT_INTERVAL_S) < REPORT_INTERVAL_S:
                continue
            pending = self.unreported.pop(instance, None)
            if pending is None:
                continue
            count, reasons, example = pending
            self.last_sent[instance] = now
            log.warning(
                "KV events from %s: %d malformed message(s) skipped %s, e.g. %s",
                instance,
                count,
                reasons,
                example,
            )
            self.telemetry.event(
                "kv_events_malformed",
                instance=instance,
                count=count,
                reasons=reasons,
                example=example,
            )


class KVSubscribers:
    """Keeps one subscriber task per instance with a configured ``kv_events`` endpoint."""

    def __init__(self, core: Any) -> None:
        self.core = core
        self.context: zmq.asyncio.Context | None = None
        self.desired: dict[str, tuple[str, str | None]] = {}
        self.running: dict[str, tuple[tuple[str, str | None], Subscriber, asyncio.Task[None]]] = {}
        self.report = MalformedReporter(core.metrics, core.telemetry)

    def sync(self, config: RouterConfig) -> None:
        if not config.router.kv_events:
            self.desired = {}
            return
        self.desired = {
            i.name: (i.kv_events, i.kv_replay)
            for i in config.instances
            if i.kv_events and i.state != "down"
        }

    def stats(self) -> dict[str, dict[str, Any]]:
        return {name: vars(sub.stats) for name, (_, sub, _) in self.running.items()}

    async def run(self) -> None:
        while True:
            self.reconcile()
            self.report.flush()
            await asyncio.sleep(RECONCILE_S)

    def reconcile(self) -> None:
        carried: dict[str, SubscriberStats] = {}
        for name in list(self.running):
            spec, sub, task = self.running[name]
            if task.done() and self.desired.get(name) == spec:
                self._crashed(sub, task)
                carried[name] = sub.stats  # the restarted subscriber keeps counting
            if self.desired.get(name) != spec or task.done():
                task.cancel()
                del self.running[name]
            else:
                sub.stats.checks += 1
        for name, spec in self.desired.items():
            if name not in self.running:
                if self.context is None:
                    self.context = zmq.asyncio.Context()
                sub = Subscriber(
                    self.core, name, spec[0], spec[1], self.context, self.report, carried.get(name)
                )
                self.running[name] = (spec, sub, asyncio.create_task(sub.run()))

    def _crashed(self, sub: Subscriber, task: asyncio.Task[None]) -> None:
        sub.stats.crashes += 1
        self.core.metrics.child(self.core.metrics.kv_subscriber_crashes, sub.name).inc()
        error = None if task.cancelled() else task.exception()
        log.error("KV subscriber of %s stopped (%r); restarting", sub.name, error, exc_info=error)

    async def close(self) -> None:
        tasks = [task for _, _, task in self.running.values()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.running.clear()
        if self.context is not None:
            self.context.destroy(linger=0)
