"""KV cache events over ZMQ, shaped like vLLM's ``ZmqEventPublisher``.

Wire format, one ZMQ multipart message per engine step that changed the cache:
``[topic, seq, payload]`` where ``seq`` is an 8-byte big-endian counter from 0
and ``payload`` is msgpack of the batch ``[ts, events, data_parallel_rank]``
(``ts`` = wall-clock Unix seconds, rank always 0).

Events have two encodings:
- ``map`` (default): each event is a map with a ``"type"`` key and named fields,
  e.g. ``{"type": "BlockStored", "block_hashes": [...], "parent_block_hash": ...,
  "token_ids": [...], "block_size": 16, "lora_id": None, "medium": "GPU",
  "lora_name": None}``;
- ``array``: vLLM's msgspec ``array_like`` + ``tag`` encoding, the tag first and
  fields in vLLM's declaration order:
  ``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
  lora_id, medium, lora_name]``, ``["BlockRemoved", block_hashes, medium]``,
  ``["AllBlocksCleared"]``. Decoders of older vLLM structs ignore trailing fields.

Replay: a ROUTER socket; a client (REQ or DEALER) sends ``[b"", start_seq]``
(8-byte big-endian) and receives every buffered batch with seq >= start_seq as
``[b"", seq, payload]``, then the end marker ``[b"", (-1 as 8 signed bytes), b""]``.

Ports: ``--kv-events tcp://HOST:P`` makes instance k publish on ``P + k`` and
answer replay requests on ``P + REPLAY_PORT_OFFSET + k``. We always bind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import msgpack
import zmq
import zmq.asyncio

from engine_interface.kv_events import END_SEQ, MEDIUM_GPU, SEQ_BYTES, encode_event

log = logging.getLogger(__name__)

REPLAY_PORT_OFFSET = 100
END_SEQ_FRAME = END_SEQ.to_bytes(SEQ_BYTES, "big", signed=True)
ENCODINGS = ("map", "array")


def instance_endpoints(base: str, index: int) -> tuple[str, str]:
    """(pub, replay) endpoints of instance ``index`` for a base ``tcp://host:port``."""
    host, _, port = base.rpartition(":")
    if not host.startswith("tcp://") or not port.isdigit():
        raise ValueError(f"--kv-events must look like tcp://HOST:PORT, got {base!r}")
    pub_port = int(port) + index
    return f"{host}:{pub_port}", f"{host}:{pub_port + REPLAY_PORT_OFFSET}"


class KVEventPublisher:
    """PUB socket + replay ROUTER socket for one instance; lives on the event loop."""

    def __init__(
        self,
        pub_endpoint: str,
        replay_endpoint: str,
        encoding: str = "map",
        topic: str = "",
        buffer_steps: int = 10_000,
    ) -> None:
        if encoding not in ENCODINGS:
            raise ValueError(f"KV event encoding must be one of {ENCODINGS}")
        self.encoding = encoding
        self.pub_endpoint = pub_endpoint
        self.replay_endpoint = replay_endpoint
        self._topic = topic.encode()
        self._ctx = zmq.asyncio.Context.instance()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(100_000)
        self._pub.bind(pub_endpoint)
        self._replay = self._ctx.socket(zmq.ROUTER)
        self._replay.bind(replay_endpoint)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._next_seq = 0
        self._replay_task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._replay_task = asyncio.ensure_future(self._serve_replay())

    def publish(self, events: Sequence[Any]) -> None:
        """The engine's kv_event_sink: one call = one batch (one engine step)."""
        if not events:
            return
        positional = self.encoding == "array"
        encoded = [encode_event(e, positional=positional, medium=MEDIUM_GPU) for e in events]
        payload = msgpack.packb([time.time(), encoded, 0], use_bin_type=True)
        seq = self._next_seq
        self._next_seq += 1
        self._buffer.append((seq, payload))
        # PUB never blocks: with no subscriber or a full queue ZMQ drops, as vLLM's does.
        self._pub.send_multipart([self._topic, seq.to_bytes(SEQ_BYTES, "big"), payload])

    async def _serve_replay(self) -> None:
        while True:
            frames = await self._replay.recv_multipart()
            if len(frames) != 3:
                log.warning("invalid KV replay request with %d frames", len(frames))
                continue
            client_id, _, start = frames
            start_seq = int.from_bytes(start, "big")
            for seq, payload in list(self._buffer):
                if seq >= start_seq:
                    await self._replay.send_multipart(
                        [client_id, b"", seq.to_bytes(SEQ_BYTES, "big"), payload]
                    )
            await self._replay.send_multipart([client_id, b"", END_SEQ_FRAME, b""])

    async def close(self) -> None:
        if self._replay_task is not None:
            self._replay_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._replay_task
        self._pub.close(linger=0)
        self._replay.close(linger=0)
