"""The publisher against hostile records in real Redis: a malformed state snapshot, sampled
decision or config notification is skipped, quarantined and counted once; every other
record is still published; no loop dies, whatever a step raises."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from controlplane.realtime.publisher import ClusterFeed, Publisher
from controlplane.services import ingest
from router_worker.contract.telemetry import (
    CONFIG_CHANNEL,
    decisions_stream,
    state_key,
    state_pattern,
)

from .helpers import instance, snapshot, write_state

pytestmark = pytest.mark.timeout(60)
DEEP = "[" * 100_000 + "]" * 100_000


def decision(cluster: str) -> dict:
    """A well-formed sampled decision of ``cluster``."""
    return {
        "cluster": cluster,
        "router": "r1",
        "request_id": "ok",
        "at": time.time(),
        "arm": "a",
        "policy": "lmetric",
        "instance": "i0",
        "reason": "score",
    }


def counted(client, source: str) -> int:
    return int(client.hget(ingest.QUARANTINE_COUNTS, source) or 0)


async def test_a_hostile_state_key_is_counted_once_and_the_others_published(setup) -> None:
    name, publisher, sent, client = setup
    source = state_pattern(name)
    client.hdel(ingest.QUARANTINE_COUNTS, source)
    client.set(state_key(name, "deep"), '{"instances": ' + DEEP + "}", ex=10)
    client.set(state_key(name, "nan"), '{"ts": NaN}', ex=10)
    write_state(client, snapshot(name, "good", [instance("i0", pending=4)]))
    await publisher.refresh_keys()
    for _ in range(3):  # the bad values stay: counted once, not at every poll
        await publisher.publish_snapshots()
        await asyncio.sleep(0.3)
        write_state(client, snapshot(name, "good", [instance("i0", pending=4)]))
    assert counted(client, source) == 2
    messages = sent.of_type("snapshot")
    assert messages and all([r["router"] for r in m["routers"]] == ["good"] for m in messages)
    client.set(state_key(name, "nan"), '{"ts": Infinity}', ex=10)  # a new bad value
    await publisher.publish_snapshots()
    assert counted(client, source) == 3
    client.hdel(ingest.QUARANTINE_COUNTS, source)


async def test_hostile_decisions_are_counted_and_the_rest_sent_as_strict_json(setup) -> None:
    name, publisher, sent, client = setup
    stream = decisions_stream(name)
    client.delete(stream)
    await publisher.forward_decisions(block_ms=10)  # the cursor starts at the tail
    good = decision(name)
    client.xadd(stream, {"data": json.dumps({**good, "ttft_s": float("nan")})})
    client.xadd(stream, {"data": json.dumps({**good, "request_id": "x" * 10})[:-1]})
    client.xadd(stream, {"nodata": "1"})
    client.xadd(stream, {"data": json.dumps(good)})
    await publisher.forward_decisions(block_ms=10)
    (message,) = sent.of_type("decisions")
    json.dumps(message, allow_nan=False)
    assert [d["request_id"] for d in message["decisions"]] == ["ok"]
    assert counted(client, stream) == 3
    client.delete(stream)
    client.hdel(ingest.QUARANTINE_COUNTS, stream)


async def test_a_config_notification_that_is_no_object_is_counted(setup) -> None:
    name, publisher, sent, client = setup
    before = counted(client, CONFIG_CHANNEL)
    for data in (b"[1, 2]", b'"text"', b'{"cluster": {"x": 1}}', b'{"version": 3}', b"\xff"):
        await publisher.forward_config(data)
    await publisher.forward_config(json.dumps({"cluster": name, "version": 9}).encode())
    assert [m["version"] for m in sent.of_type("config")] == [9]
    assert counted(client, CONFIG_CHANNEL) - before == 5


async def test_a_loop_survives_any_error_of_its_step(setup) -> None:
    _, publisher, _, _ = setup
    stop, calls = asyncio.Event(), []

    async def step() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise KeyError("a bug")
        stop.set()

    publisher_run = Publisher._forever(publisher, stop, step, 0)
    await asyncio.wait_for(publisher_run, 10)
    assert len(calls) == 2 and publisher.loop_errors == 1


async def test_a_forged_count_or_a_wrong_typed_stream_stops_no_cluster(setup) -> None:
    """A non-integer quarantine count made every later HINCRBY fail (the decisions of that
    tick were lost), and a string where a cluster's decisions stream belongs failed the one
    XREAD of every cluster's streams, for ever."""
    name, publisher, sent, client = setup
    stream, squatted = decisions_stream(name), decisions_stream(f"{name}-squatted")
    client.delete(stream)
    client.hset(ingest.QUARANTINE_COUNTS, stream, "lots")
    client.set(squatted, "not a stream", ex=30)
    publisher.feeds[f"{name}-squatted"] = ClusterFeed(999_999, f"{name}-squatted")
    await publisher.forward_decisions(block_ms=10)  # cursors start at the tails
    good = decision(name)
    client.xadd(stream, {"nodata": "1"})
    client.xadd(stream, {"data": json.dumps(good)})
    await publisher.forward_decisions(block_ms=10)
    (message,) = sent.of_type("decisions")
    assert [d["request_id"] for d in message["decisions"]] == ["ok"]
    assert counted(client, stream) == 1  # the forged count restarted from 0
    assert squatted in publisher.unreadable_streams
    del publisher.feeds[f"{name}-squatted"]
    client.delete(stream, squatted)
    client.hdel(ingest.QUARANTINE_COUNTS, stream)
