"""Replica sync between real router processes on one enginesim fleet, over the real Redis."""

from __future__ import annotations

import functools
import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from devharness import Router, wait_until
from router_worker.peers import PeerKeys, channel_for
from tests.router.helpers import MODEL, PEER_ENV, PEER_KEY, router_config, scrape_total

REDIS_URL = os.environ.get("SWITCHYARD_REDIS_URL", "redis://127.0.0.1:6379/10")
# A slow fault this strong keeps a long prompt in prefill for many wall seconds.
SLOW = 20_000.0


def _document(fleet: Any, *, peer_sync: bool = True) -> dict[str, Any]:
    document = router_config(fleet, "lmetric", cluster=f"peers-{uuid.uuid4().hex[:10]}")
    # the default peer_timeout_s (5 s, five heartbeats): at 1 s one heartbeat late on a
    # loaded machine dropped a live peer, or a message's effect before it was checked
    document["router"].update(peer_sync=peer_sync)
    return document


def _instances(router: Router) -> dict[str, dict[str, Any]]:
    return {i["name"]: i for i in router.state()["snapshot"]["instances"]}


def _busy(router: Router) -> dict[str, dict[str, Any]]:
    return {name: i for name, i in _instances(router).items() if i["in_flight"]}


def _peer_counts(router: Router) -> dict[str, int]:
    return router.state()["peers"]["counts"]


def _metric(router: Router, name: str, **labels: str) -> float:
    return scrape_total(router.url, name, **labels)


def _hears(router: Router, others: set[str]) -> bool:
    return others <= set(router.state()["peers"]["peers"])


def _hear_each_other(*routers: Router) -> None:
    for router in routers:
        others = {f"r{r.port}" for r in routers if r is not router}
        wait_until(
            functools.partial(_hears, router, others),
            15,
            "peers heard",
        )


@pytest.fixture
def slow_fleet(fleet: Any) -> Iterator[Any]:
    """The shared fleet with every instance slowed down; recovered afterwards."""
    try:
        for k in range(fleet.size):
            fleet.fault(k, "slow", factor=SLOW)
        yield fleet
    finally:
        fleet.recover()


class LongRequest(threading.Thread):
    """One long streamed completion sent to ``router`` in the background."""

    def __init__(self, router: Router) -> None:
        super().__init__(daemon=True)
        self.router = router
        self.status: int | None = None
        self.error: Exception | None = None

    def run(self) -> None:
        body = {
            "model": MODEL,
            "prompt": "a long document about peers " * 600,
            "max_tokens": 4,
            "stream": True,
        }
        try:
            with httpx.stream(
                "POST", self.router.url + "/v1/completions", json=body, timeout=120
            ) as response:
                response.read()
                self.status = response.status_code
        except httpx.HTTPError as error:
            self.error = error


def _peers_with_a_long_request(slow_fleet, router_factory):
    """Two synced routers on the slow fleet, a long request on its way through the first."""
    document = _document(slow_fleet)
    first = router_factory(document, redis_url=REDIS_URL, env=PEER_ENV)
    second = router_factory(document, redis_url=REDIS_URL, env=PEER_ENV)
    _hear_each_other(first, second)
    request = LongRequest(first)
    request.start()
    return first, second, request


def test_a_request_sent_to_one_router_is_pending_at_its_peer_until_it_ends(
    slow_fleet, router_factory
):
    first, second, request = _peers_with_a_long_request(slow_fleet, router_factory)
    wait_until(lambda: len(_busy(first)) == 1, 20, "the request in flight at its router")
    (instance,) = _busy(first)
    wait_until(lambda: instance in _busy(second), 10, "the request seen by the peer")
    seen = _busy(second)[instance]
    assert list(_busy(second)) == [instance] and seen["in_flight"] == 1
    assert seen["pending_prefill_tokens"] > 1000  # its uncached prompt, still in prefill
    for k in range(slow_fleet.size):
        slow_fleet.fault(k, "recover")
    request.join(60)
    assert request.status == 200, request.error
    wait_until(lambda: not _busy(second), 30, "the request gone at the peer")
    counts = _peer_counts(second)
    assert counts["applied:dispatch"] == 1 and counts["applied:end"] == 1
    assert _metric(second, "switchyard_router_peer_applied_total", kind="dispatch") == 1
    assert _metric(first, "switchyard_router_peer_sent_total", kind="dispatch") == 1
    # peers heard within peer_timeout_s: on a starved CPU a heartbeat can be late,
    # and the gauge is back once the next one arrives
    wait_until(lambda: _metric(second, "switchyard_router_peers") == 1, 30, "the peer heard")


def test_without_peer_sync_a_peers_request_stays_invisible(slow_fleet, router_factory):
    document = _document(slow_fleet, peer_sync=False)
    first = router_factory(document, redis_url=REDIS_URL, env=PEER_ENV)
    second = router_factory(document, redis_url=REDIS_URL, env=PEER_ENV)
    request = LongRequest(first)
    request.start()
    wait_until(lambda: len(_busy(first)) == 1, 20, "the request in flight at its router")
    # the peer hears nothing however long it is given: wait for a few of its sweeps
    settled = threading.Event()
    settled.wait(1.5)
    assert not _busy(second)
    state = second.state()["peers"]
    assert state["enabled"] is False and state["peers"] == {} and state["counts"] == {}
    for k in range(slow_fleet.size):
        slow_fleet.fault(k, "recover")
    request.join(60)
    assert request.status == 200, request.error


def test_malformed_peer_messages_are_counted_and_ignored(fleet, router_factory):
    document = _document(fleet)
    router = router_factory(document, redis_url=REDIS_URL, env=PEER_ENV)
    channel = f"switchyard:peers:{document['cluster']}"
    ghost = {
        "kind": "dispatch",
        "id": "ghost/x-1",
        "instance": "i2",
        "prompt_tokens": 3000,
        "cached_tokens": 0,
        "block_size": 16,
        "block_hashes": "",
    }
    envelope = {"v": 2, "router": "ghost", "nonce": "n", "seq": 1}
    keys = PeerKeys(PEER_KEY)
    assert channel == channel_for(document["cluster"])

    def signed(document: dict[str, Any] | bytes) -> bytes:
        body = document if isinstance(document, bytes) else json.dumps(document).encode()
        return keys.sign(channel, body)

    client = redis.Redis.from_url(REDIS_URL)
    try:
        wait_until(lambda: client.pubsub_numsub(channel)[0][1] >= 1, 10, "subscribed")
        client.publish(channel, signed(b"\x00 not json"))
        client.publish(channel, signed({**envelope, "at": time.time(), "v": 99, "msgs": []}))
        client.publish(channel, json.dumps({**envelope, "at": time.time(), "msgs": [ghost]}))
        client.publish(
            channel,
            signed(
                {
                    **envelope,
                    "at": time.time(),
                    "msgs": [{**ghost, "id": "x-1"}, {**ghost, "prompt_tokens": -5}, "junk"],
                }
            ),
        )
        wait_until(
            lambda: (
                sum(v for k, v in _peer_counts(router).items() if k.startswith("malformed:")) == 6
            ),
            10,
            "malformed counted",
        )
        assert _metric(router, "switchyard_router_peer_malformed_total", reason="json") == 1
        assert _metric(router, "switchyard_router_peer_malformed_total", reason="version") == 1
        assert _metric(router, "switchyard_router_peer_malformed_total", reason="unsigned") == 1
        assert not _busy(router)
        # the subscriber is still alive: a well-formed message is applied after them
        client.publish(channel, signed({**envelope, "seq": 2, "at": time.time(), "msgs": [ghost]}))
        wait_until(lambda: "i2" in _busy(router), 10, "the valid message applied")
        assert _instances(router)["i2"]["pending_prefill_tokens"] == 3000
        # the ghost sends no heartbeat: dropped after peer_timeout_s
        wait_until(lambda: not _busy(router), 30, "the silent ghost dropped")
        assert _peer_counts(router)["dropped:peer_timeout"] == 1
        assert _metric(router, "switchyard_router_peer_task_restarts_total") == 0
    finally:
        client.close()


def test_a_killed_routers_requests_are_dropped_by_its_peer(slow_fleet, router_factory):
    first, second, request = _peers_with_a_long_request(slow_fleet, router_factory)
    wait_until(lambda: len(_busy(second)) == 1, 20, "the request seen by the peer")
    first.process.kill()
    first.process.wait(10)
    wait_until(lambda: not _busy(second), 30, "the dead peer's request dropped")
    assert _peer_counts(second)["dropped:peer_timeout"] == 1
    assert second.state()["peers"]["peers"] == {}
    request.join(30)
    assert request.status is None  # its router died under it
