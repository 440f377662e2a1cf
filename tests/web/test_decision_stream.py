"""Sampled routing decisions on their way to the live view, against real Redis: the first
paint reads the newest ones, the publisher forwards new ones per cluster at most once a
tick, newest first."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
import redis.asyncio as aioredis
from django.conf import settings
from django.urls import reverse

from controlplane.realtime.publisher import Publisher, PublisherSettings
from controlplane.realtime.state import DECISIONS_SHOWN, group_name
from devharness import wait_until_async
from router_worker.contract.telemetry import CandidateScore, DecisionRecord, decisions_stream

pytestmark = pytest.mark.timeout(60)


def decision(cluster: str, request_id: str, **extra) -> DecisionRecord:
    candidates = [
        CandidateScore(
            instance="i1", score=120.0, cached_tokens=64, pending_prefill_tokens=40, batch_size=3
        ),
        CandidateScore(
            instance="i0", score=900.0, cached_tokens=0, pending_prefill_tokens=300, batch_size=3
        ),
    ]
    fields = {
        "cluster": cluster,
        "router": "r1",
        "request_id": request_id,
        "at": time.time(),
        "arm": "default",
        "policy": "lmetric",
        "instance": "i1",
        "reason": "score",
        "candidates": candidates,
        "candidates_total": 2,
        **extra,
    }
    return DecisionRecord(**fields)


def write_decision(client, record: DecisionRecord) -> None:
    client.xadd(decisions_stream(record.cluster), record.to_stream_fields())


class Collector:
    def __init__(self) -> None:
        self.messages: list[tuple[str, dict]] = []

    async def __call__(self, group: str, message: dict) -> None:
        self.messages.append((group, message))


@pytest.fixture
async def feed(redis_client):
    name, other = (f"dec-{uuid.uuid4().hex[:8]}" for _ in range(2))
    client = aioredis.from_url(settings.REDIS_URL)
    sent = Collector()
    publisher = Publisher(
        client,
        sent,
        PublisherSettings(interval_s=0.25, poll_s=0.01),
        load_clusters=lambda: {name: 42, other: 43},
    )
    await publisher.refresh_clusters()
    yield name, other, publisher, sent, redis_client
    redis_client.delete(decisions_stream(name), decisions_stream(other))
    await client.aclose()


async def test_new_decisions_are_forwarded_per_cluster_newest_first(feed) -> None:
    name, other, publisher, sent, client = feed
    write_decision(client, decision(name, "old"))  # before the publisher looked: history
    await publisher.forward_decisions(block_ms=50)
    assert sent.messages == []
    for n in range(3):
        write_decision(client, decision(name, f"new-{n}"))
    client.xadd(decisions_stream(name), {"data": "{not json"})
    write_decision(
        client, decision(other, "elsewhere", hot_class="00ab", reason="hotspot_fallback")
    )
    await publisher.forward_decisions(block_ms=50)
    by_group = dict(sent.messages)
    assert set(by_group) == {group_name(42), group_name(43)}
    mine = by_group[group_name(42)]
    assert (mine["type"], mine["cluster_id"]) == ("decisions", 42)
    assert [d["request_id"] for d in mine["decisions"]] == ["new-2", "new-1", "new-0"]
    assert mine["decisions"][0]["candidates"][0] == {
        "instance": "i1",
        "score": 120.0,
        "cached_tokens": 64,
        "pending_prefill_tokens": 40.0,
        "batch_size": 3.0,
    }
    theirs = by_group[group_name(43)]["decisions"]
    assert [(d["request_id"], d["hot_class"]) for d in theirs] == [("elsewhere", "00ab")]
    sent.messages.clear()
    await publisher.forward_decisions(block_ms=50)  # nothing new: nothing sent
    assert sent.messages == []


async def test_a_backlog_goes_out_in_bounded_messages(feed) -> None:
    name, _other, publisher, sent, client = feed
    await publisher.forward_decisions(block_ms=50)
    for n in range(DECISIONS_SHOWN + 10):
        write_decision(client, decision(name, f"r{n}"))
    await publisher.forward_decisions(block_ms=50)
    await publisher.forward_decisions(block_ms=50)
    sizes = [len(m["decisions"]) for _, m in sent.messages]
    assert sizes == [DECISIONS_SHOWN, 10]
    assert sent.messages[1][1]["decisions"][0]["request_id"] == f"r{DECISIONS_SHOWN + 9}"


async def test_the_publisher_loop_sends_decisions_within_a_tick(feed) -> None:
    name, _other, publisher, sent, client = feed
    stop = asyncio.Event()
    task = asyncio.create_task(publisher._forever(stop, publisher.forward_decisions, 0.25))
    try:
        await wait_until_async(
            lambda: publisher.feeds[name].decisions_cursor is not None, 5, "the decisions cursor"
        )
        write_decision(client, decision(name, "live-1"))
        await wait_until_async(lambda: sent.messages, 5, "a decisions message sent")
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
    assert sent.messages[0][1]["decisions"][0]["request_id"] == "live-1"


def test_the_first_paint_carries_the_newest_decisions(as_role, cluster, redis_client) -> None:
    try:
        for n in range(DECISIONS_SHOWN + 5):
            write_decision(redis_client, decision(cluster.name, f"req-{n}"))
        body = as_role("viewer").get(reverse("web:snapshot", args=[cluster.pk])).json()
    finally:
        redis_client.delete(decisions_stream(cluster.name))
    ids = [d["request_id"] for d in body["decisions"]]
    assert len(ids) == DECISIONS_SHOWN
    assert ids[0] == f"req-{DECISIONS_SHOWN + 4}" and ids[-1] == "req-5"
