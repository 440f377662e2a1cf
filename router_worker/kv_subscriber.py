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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio

from router_worker.config import RouterConfig
from router_worker.routing import (
    AllBlocksCleared,
    KVEventBatch,
    KVEventDecodeError,
    decode_kv_event_batch,
)

log = logging.getLogger("router_worker.kv")

END_SEQ = -1
REPLAY_TIMEOUT_S = 1.0
RECONCILE_S = 1.0


@dataclass
class SubscriberStats:
    batches: int = 0
    gaps: int = 0
    recovered_batches: int = 0
    unrecovered_gaps: int = 0
    decode_errors: int = 0
    restarts: int = 0
    last_seq: int | None = None


class Subscriber:
    def __init__(self, core: Any, name: str, endpoint: str, replay: str | None,
                 context: zmq.asyncio.Context) -> None:
        self.core = core
        self.name = name
        self.endpoint = endpoint
        self.replay = replay
        self.context = context
        self.stats = SubscriberStats()

    async def run(self) -> None:
        socket = self.context.socket(zmq.SUB)
        socket.setsockopt(zmq.SUBSCRIBE, b"")
        socket.setsockopt(zmq.LINGER, 0)
        socket.connect(self.endpoint)
        try:
            while True:
                frames = await socket.recv_multipart()
                if len(frames) < 3:
                    self.stats.decode_errors += 1
                    continue
                await self.receive(int.from_bytes(frames[-2], "big", signed=True), frames[-1])
        finally:
            socket.close(linger=0)

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
            await socket.send_multipart([b"", start.to_bytes(8, "big")])
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
            seq = int.from_bytes(frames[-2], "big", signed=True)
            if seq == END_SEQ:
                return count
            if seq < stop:
                self.apply(frames[-1])
                count += 1
                self.stats.recovered_batches += 1

    def apply(self, payload: bytes) -> None:
        try:
            batch = decode_kv_event_batch(payload)
        except KVEventDecodeError:
            self.stats.decode_errors += 1
            return
        self.apply_batch(batch)

    def apply_batch(self, batch: KVEventBatch) -> None:
        state = self.core.state
        if state is None or self.name not in state.ids:
            return
        state.on_kv_event_batch(self.name, batch, time.time())
        self.stats.batches += 1


class KVSubscribers:
    """Keeps one subscriber task per instance with a configured ``kv_events`` endpoint."""

    def __init__(self, core: Any) -> None:
        self.core = core
        self.context: zmq.asyncio.Context | None = None
        self.desired: dict[str, tuple[str, str | None]] = {}
        self.running: dict[str, tuple[tuple[str, str | None], Subscriber, asyncio.Task[None]]] = {}

    def sync(self, config: RouterConfig) -> None:
        if not config.router.kv_events:
            self.desired = {}
            return
        self.desired = {i.name: (i.kv_events, i.kv_replay) for i in config.instances
                        if i.kv_events and i.state != "down"}

    def stats(self) -> dict[str, dict[str, Any]]:
        return {name: vars(sub.stats) for name, (_, sub, _) in self.running.items()}

    async def run(self) -> None:
        while True:
            self.reconcile()
            await asyncio.sleep(RECONCILE_S)

    def reconcile(self) -> None:
        for name in list(self.running):
            spec, _, task = self.running[name]
            if self.desired.get(name) != spec or task.done():
                task.cancel()
                del self.running[name]
        for name, spec in self.desired.items():
            if name not in self.running:
                if self.context is None:
                    self.context = zmq.asyncio.Context()
                sub = Subscriber(self.core, name, spec[0], spec[1], self.context)
                self.running[name] = (spec, sub, asyncio.create_task(sub.run()))

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
