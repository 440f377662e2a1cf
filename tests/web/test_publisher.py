"""The publisher loop against real Redis: coalesced snapshots, events and config changes
forwarded at once, and the whole path through the Channels layer to a websocket."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from controlplane.realtime.publisher import ClusterFeed
from controlplane.realtime.state import group_name
from devharness import wait_until_async
from router_worker.contract.telemetry import CONFIG_CHANNEL, EventRecord, events_stream

from .helpers import hotspot_payload, instance, snapshot, write_event, write_state

pytestmark = pytest.mark.timeout(60)


class Clock:
    """The publisher's wall clock, moved by the test: ticks are 0.25 s (``setup``), and a
    stalled test process cannot make a tick pass that the test did not pass."""

    def __init__(self) -> None:
        self.now = time.time()

    def time(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    from controlplane.realtime import publisher

    fake = Clock()
    monkeypatch.setattr(publisher, "time", fake)
    return fake


async def test_one_snapshot_per_tick_carrying_window_maxima(setup, clock) -> None:
    name, publisher, sent, client = setup
    r1 = [instance("i0", pending=10, pending_max=700)]
    write_state(client, snapshot(name, "r1", r1, ts=clock.advance(0.01)))
    write_state(client, snapshot(name, "r2", [instance("i0", pending=5, pending_max=20)]))
    await publisher.refresh_keys()
    await publisher.publish_snapshots()
    r1 = [instance("i0", pending=1, pending_max=1)]
    write_state(client, snapshot(name, "r1", r1, ts=clock.advance(0.01)))
    await publisher.publish_snapshots()  # new data, but within the same tick: coalesced
    (first,) = sent.of_type("snapshot")
    assert sent.messages[0][0] == group_name(42)
    assert first["instances"][0]["pending_prefill_tokens_max"] == 720
    assert [r["router"] for r in first["routers"]] == ["r1", "r2"]
    clock.advance(0.3)
    r2 = [instance("i0", pending=5, pending_max=20)]
    write_state(client, snapshot(name, "r2", r2, ts=clock.advance(0.01)))
    await publisher.publish_snapshots()  # next tick, at a fresh write
    second = sent.of_type("snapshot")[1]
    assert second["instances"][0]["pending_prefill_tokens_max"] == 21
    assert second["published_at"] >= second["ts"]


async def test_a_held_change_goes_out_within_two_ticks(setup, clock) -> None:
    name, publisher, sent, client = setup
    write_state(client, snapshot(name, "r1", [instance("i0", pending=1)], ts=clock.now))
    await publisher.refresh_keys()
    await publisher.publish_snapshots()
    write_state(client, snapshot(name, "r1", [instance("i0", pending=2)], ts=clock.advance(0.01)))
    await publisher.publish_snapshots()  # within the tick: held
    clock.advance(0.3)
    await publisher.publish_snapshots()  # a tick later, but no fresh write: still held
    assert len(sent.of_type("snapshot")) == 1
    clock.advance(0.25)
    await publisher.publish_snapshots()  # two ticks: sent anyway
    assert [m["instances"][0]["pending_prefill_tokens"] for m in sent.of_type("snapshot")] == [1, 2]


async def test_unchanged_state_is_not_resent(setup, clock) -> None:
    name, publisher, sent, client = setup
    write_state(client, snapshot(name, "r1", [instance("i0")], ts=clock.now))
    await publisher.refresh_keys()
    await publisher.publish_snapshots()
    clock.advance(0.3)
    await publisher.publish_snapshots()
    clock.advance(0.3)
    await publisher.publish_snapshots()  # two ticks and more: still nothing new to send
    assert len(sent.of_type("snapshot")) == 1


async def test_events_are_forwarded_each_and_at_once(setup) -> None:
    name, publisher, sent, client = setup
    task = asyncio.create_task(publisher._events_loop())
    try:
        await wait_until_async(lambda: publisher.cursor is not None, 5, "the events cursor")
        write_event(client, name, "hotspot", **hotspot_payload("suspected"))
        write_event(client, name, "hotspot", **hotspot_payload("confirmed"))
        write_event(client, name, "events_dropped", count=3)  # ingest-only: not forwarded
        write_event(client, "some-other-cluster", "hotspot", **hotspot_payload())
        await wait_until_async(lambda: len(sent.of_type("event")) >= 2, 5, "two events sent")
    finally:
        task.cancel()
    transitions = [m["event"]["payload"]["transition"] for m in sent.of_type("event")]
    assert transitions == ["suspected", "confirmed"]
    assert all(group == group_name(42) for group, _ in sent.messages)


async def test_config_notifications_are_forwarded(setup) -> None:
    name, publisher, sent, client = setup
    others = client.pubsub_numsub(CONFIG_CHANNEL)[0][1]  # routers of concurrent test runs
    task = asyncio.create_task(publisher._config_loop())
    try:
        await wait_until_async(
            lambda: client.pubsub_numsub(CONFIG_CHANNEL)[0][1] > others, 5, "a config subscriber"
        )
        client.publish(CONFIG_CHANNEL, json.dumps({"cluster": name, "version": 9}))
        await wait_until_async(lambda: sent.of_type("config"), 5, "a config message sent")
    finally:
        task.cancel()
    (message,) = sent.of_type("config")
    assert (message["version"], message["cluster_id"]) == (9, 42)


async def test_malformed_state_is_skipped(setup) -> None:
    name, publisher, sent, client = setup
    client.set(f"switchyard:state:{name}:broken", "{not json", ex=10)
    write_state(client, snapshot(name, "r1", [instance("i0", pending=3)]))
    await publisher.refresh_keys()
    await publisher.publish_snapshots()
    (message,) = sent.of_type("snapshot")
    assert [r["router"] for r in message["routers"]] == ["r1"]


async def test_events_of_a_clusters_own_stream_are_forwarded_for_that_cluster_only(setup) -> None:
    """What routers with their own Redis identity write: the cluster's stream, where an
    event naming another cluster is skipped."""
    name, publisher, sent, client = setup
    stream = events_stream(name)
    publisher.feeds["elsewhere"] = ClusterFeed(43, "elsewhere")  # a cluster it also serves
    task = asyncio.create_task(publisher._events_loop())
    try:
        feed = publisher.feeds[name]
        await wait_until_async(lambda: feed.events_cursor is not None, 5, "its events cursor")
        for cluster, transition in ((name, "suspected"), ("elsewhere", "confirmed")):
            event = EventRecord.new(
                cluster, "r1", "hotspot", time.time(), **hotspot_payload(transition)
            )
            client.xadd(stream, event.to_stream_fields())
        client.xadd(
            stream,
            EventRecord.new(
                name, "r1", "hotspot", time.time(), **hotspot_payload("cleared")
            ).to_stream_fields(),
        )
        await wait_until_async(lambda: len(sent.of_type("event")) >= 2, 5, "events sent")
    finally:
        task.cancel()
        client.delete(stream)
    transitions = [m["event"]["payload"]["transition"] for m in sent.of_type("event")]
    assert transitions == ["suspected", "cleared"]
    assert all(group == group_name(42) for group, _ in sent.messages)
