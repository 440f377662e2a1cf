"""Malformed KV events: the decoder refuses anything mis-typed with KVEventDecodeError only,
and the live subscribers (real ZMQ sockets, a real RouterCore) skip and count bad messages
while the good ones around them still update the KV index."""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import pytest
import zmq
import zmq.asyncio
from hypothesis import given, settings
from hypothesis import strategies as st

from devharness import wait_until_async
from router_worker.contract.config import parse_config
from router_worker.core import RouterCore
from router_worker.kv_subscriber import KVSubscribers
from router_worker.metrics import RouterMetrics
from router_worker.routing import (
    ClusterState,
    KVEventDecodeError,
    decode_kv_event_batch,
    hash_blocks,
)
from router_worker.telemetry import Telemetry
from tests.router.helpers import BLOCK, TOKENS, WRONG_TYPES, stored

SEQ = 8


def good_batch(tokens: list[int] = TOKENS, first_hash: int = 500) -> bytes:
    hashes = list(range(first_hash, first_hash + len(tokens) // BLOCK))
    return msgpack.packb([1.0, [stored(hashes, tokens)], 0])


@pytest.mark.parametrize("payload", WRONG_TYPES.values(), ids=WRONG_TYPES.keys())
def test_wrong_types_are_refused_with_the_decode_error(payload):
    with pytest.raises(KVEventDecodeError):
        decode_kv_event_batch(payload)


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)


def hostile(valid: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(valid, valid, msgpack_values)


hostile_stored = st.tuples(
    st.just("BlockStored"),
    hostile(st.lists(st.integers(0, 2**64 - 1), max_size=4)),
    hostile(st.none() | st.integers(0, 2**64 - 1)),
    hostile(st.lists(st.integers(0, 2**32), min_size=16, max_size=64)),
    hostile(st.sampled_from([16, 32])),
    hostile(st.none()),
    hostile(st.sampled_from([None, "GPU", "CPU"])),
).map(list)
hostile_removed = st.tuples(
    st.just("BlockRemoved"),
    hostile(st.lists(st.integers(0, 2**64 - 1), max_size=4)),
    hostile(st.just("GPU")),
).map(list)
hostile_batches = (
    st.tuples(
        hostile(st.floats(0, 2e9)),
        hostile(st.lists(st.one_of(hostile_stored, hostile_removed, msgpack_values), max_size=5)),
        hostile(st.none() | st.just(0)),
    ).map(list)
    | msgpack_values
)


@given(batch=hostile_batches, positional=st.booleans())
@settings(max_examples=400, deadline=None)
def test_any_payload_is_decoded_and_applied_or_refused_with_the_decode_error(batch, positional):
    if not positional and isinstance(batch, list) and len(batch) == 3:
        batch = {"ts": batch[0], "events": batch[1], "data_parallel_rank": batch[2]}
    state = ClusterState(block_size=BLOCK)
    state.add_instance("i0")
    try:
        decoded = decode_kv_event_batch(msgpack.packb(batch))
    except KVEventDecodeError:
        return
    state.on_kv_event_batch("i0", decoded, 1.0)  # what decodes, the index can apply


# ----- the live subscribers: real ZMQ sockets in front of a real RouterCore ----------------


class Publishers:
    """One ZMQ PUB socket per instance, sending vLLM's frames [topic, seq, payload]."""

    def __init__(self, context: zmq.asyncio.Context, count: int) -> None:
        self.sockets = [context.socket(zmq.PUB) for _ in range(count)]
        self.ports = [s.bind_to_random_port("tcp://127.0.0.1") for s in self.sockets]
        self.seq = [0] * count

    async def send(self, index: int, payload: bytes, frames: list[bytes] | None = None) -> None:
        if frames is None:
            frames = [b"kv", self.seq[index].to_bytes(SEQ, "big"), payload]
            self.seq[index] += 1
        await self.sockets[index].send_multipart(frames)

    def close(self) -> None:
        for socket in self.sockets:
            socket.close(linger=0)


def make_core(ports: list[int]) -> RouterCore:
    core = RouterCore("r-test", Telemetry("r-test", None), RouterMetrics())
    core.apply_config(
        parse_config(
            {
                "cluster": "kv",
                "instances": [
                    {
                        "name": f"i{k}",
                        "url": f"http://127.0.0.1:{9 + k}",
                        "kv_events": f"tcp://127.0.0.1:{port}",
                    }
                    for k, port in enumerate(ports)
                ],
                "policy": {"kind": "lmetric", "params": {}},
                "router": {"kv_events": True},
            }
        )
    )
    return core


def cached_blocks(core: RouterCore, tokens: list[int]) -> list[int]:
    assert core.state is not None  # the core is configured
    return core.state.kv.longest_prefixes(hash_blocks(tokens, BLOCK)).tolist()


async def connected(subs: KVSubscribers, pubs: Publishers, index: int) -> None:
    """ZMQ drops what a PUB sends before the SUB is connected: probe until one arrives."""
    name = f"i{index}"

    def got() -> bool:
        return subs.stats().get(name, {}).get("batches", 0) > 0

    async def probe() -> None:
        while True:
            await pubs.send(index, msgpack.packb([0.0, [], 0]))
            await asyncio.sleep(0.05)

    prober = asyncio.create_task(probe())
    try:
        await wait_until_async(got, 10.0, f"the KV subscriber of {name} receiving")
    finally:
        prober.cancel()


def test_bad_messages_are_skipped_and_counted_and_good_ones_still_update_the_index():
    async def scenario() -> tuple[RouterCore, dict[str, Any]]:
        context = zmq.asyncio.Context()
        pubs = Publishers(context, 2)
        core = make_core(pubs.ports)
        subs = KVSubscribers(core)
        assert core.runtime is not None  # the core is configured
        subs.sync(core.runtime.config)
        loop = asyncio.create_task(subs.run())
        try:
            await connected(subs, pubs, 0)
            await connected(subs, pubs, 1)
            task_before = subs.running["i0"][2]
            for payload in WRONG_TYPES.values():
                await pubs.send(0, payload)
            await pubs.send(0, b"", frames=[b"kv"])  # too few frames
            await pubs.send(0, b"", frames=[b"kv", b"\x01", good_batch()])  # 1-byte seq
            await pubs.send(0, good_batch())
            await pubs.send(1, good_batch(TOKENS[:32], first_hash=900))
            # i0's good batch came after its garbage: once it is applied, the subscriber
            # has read every bad message before it and lived
            await wait_until_async(
                lambda: cached_blocks(core, TOKENS) == [4, 2], 10, "the good batches"
            )
            checks = subs.stats()["i0"]["checks"]
            subs.reconcile()  # the pass that would replace (and count) a dead task
            assert subs.running["i0"][2] is task_before and not task_before.done()
            assert subs.stats()["i0"]["checks"] == checks + 1  # it found the task running
            return core, subs.stats()["i0"]
        finally:
            loop.cancel()
            await subs.close()
            pubs.close()
            context.destroy(linger=0)

    core, stats = asyncio.run(scenario())
    assert stats["decode_errors"] == len(WRONG_TYPES) + 2 and stats["crashes"] == 0
    assert stats["malformed"] == {"decode": len(WRONG_TYPES), "frames": 1, "sequence": 1}
    metrics = core.metrics.render().decode()
    assert (
        'switchyard_router_kv_events_malformed_total{instance="i0",reason="decode"} '
        f"{float(len(WRONG_TYPES))}"
    ) in metrics
    [event] = [e for e in core.telemetry.recent_events if e["kind"] == "kv_events_malformed"]
    assert event["payload"]["instance"] == "i0" and event["payload"]["count"] >= 1


def test_a_subscriber_that_keeps_dying_is_counted_not_silently_respawned():
    async def scenario() -> tuple[RouterCore, int]:
        core = make_core([1])
        subs = KVSubscribers(core)
        subs.desired = {"i0": ("not-an-endpoint", None)}  # connect() raises
        for _ in range(3):
            subs.reconcile()
            await asyncio.sleep(0.05)
        crashes = subs.stats()["i0"]["crashes"]  # carried over to the respawned task
        await subs.close()
        return core, crashes

    core, crashes = asyncio.run(scenario())
    assert crashes == 2
    metrics = core.metrics.render().decode()
    assert 'switchyard_router_kv_subscriber_crashes_total{instance="i0"} 2.0' in metrics
