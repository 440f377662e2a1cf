"""Drill: a router's own Redis identity (an ACL user made as the routers worker makes it,
on a private redis-server). Redis itself refuses (NOPERM) every write outside the router's
cluster: another cluster's streams, state and peer channel, the streams shared by all
clusters, the control plane's config channel, quarantine, Celery and Channels keys, and
administration; within its own cluster, metrics under another router's name and SET or
EXPIRE on any stream or a sibling's state. A real router connecting with that identity
serves while Redis refuses it (before its user exists) and, once it does, writes its
state, events and own metrics and publishes its peer heartbeats."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest
import redis

from controlplane.router_hosts import identity
from controlplane.services import ingest
from devharness import wait_until
from router_worker.contract import telemetry as contract
from tests.drills.helpers import drill_config
from tests.drills.report import Outcome, record
from tests.router.helpers import MODEL, PEER_ENV


def _refused(client: redis.Redis, *command: object) -> bool:
    """Redis answered NOPERM (redis-py raises NoPermissionError for that reply only)."""
    try:
        client.execute_command(*command)
    except redis.exceptions.NoPermissionError:
        return True
    return False


def _forbidden(cluster: str, router: str) -> list[tuple[object, ...]]:
    other = "other-cluster"
    data = ("data", "{}")
    return [
        ("XADD", contract.events_stream(other), "*", *data),
        ("XADD", contract.metrics_stream(other), "*", *data),
        # within its cluster: no metrics under a sibling's name, nor in the stream without
        # an owner; no SET or EXPIRE on a stream (a SET replaces one, an EXPIRE drops it)
        ("XADD", contract.metrics_stream(cluster), "*", *data),
        ("XADD", contract.router_metrics_stream(cluster, "a-sibling"), "*", *data),
        ("SET", contract.events_stream(cluster), "x"),
        ("SET", contract.capture_stream(cluster), "x"),
        ("EXPIRE", contract.events_stream(cluster), 1),
        ("EXPIRE", contract.router_metrics_stream(cluster, router), 1),
        ("EXPIRE", contract.state_key(cluster, "a-sibling"), 1),
        ("XADD", contract.decisions_stream(other), "*", *data),
        ("XADD", contract.EVENTS_STREAM, "*", *data),
        ("XADD", contract.METRICS_STREAM, "*", *data),
        ("SET", contract.state_key(other, router), "{}"),
        ("SET", contract.state_key(cluster, "a-sibling"), "{}"),  # only its own state key
        ("GET", contract.state_key(other, router)),
        ("DEL", contract.events_stream(cluster)),
        ("XRANGE", contract.events_stream(cluster), "-", "+"),  # writes, never reads
        ("PUBLISH", contract.CONFIG_CHANNEL, '{"cluster": "x", "version": 99}'),
        ("PUBLISH", contract.peers_channel(other), "x"),
        ("XADD", ingest.QUARANTINE_STREAM, "*", *data),
        ("HINCRBY", ingest.QUARANTINE_COUNTS, "x", 1),
        ("LPUSH", "celery", "x"),
        ("SET", "switchyard:asgi:group:cluster-1", "x"),
        ("KEYS", "*"),
        ("FLUSHALL",),
        ("CONFIG", "SET", "maxmemory", "1"),
        ("ACL", "SETUSER", "intruder", "on", ">pw", "+@all", "~*"),
    ]


@pytest.mark.django_db(databases=[])
def test_a_routers_redis_identity_confines_it_to_its_cluster(
    drill_fleet, drill_redis, router_factory
):
    cluster = f"acl-{uuid.uuid4().hex[:8]}"
    admin = redis.Redis(port=drill_redis.port)
    ident = identity.new_identity(1, cluster, "pending")
    document = drill_config(drill_fleet, "lmetric")
    document["cluster"] = cluster
    outcome = Outcome()
    # Started before its user exists: Redis refuses it, it serves all the same.
    router = router_factory(document, redis_url=ident.url(drill_redis.url), env=PEER_ENV)
    ident.router = f"r{router.port}"
    body = {"model": MODEL, "prompt": "acl drill", "max_tokens": 2}
    for _ in range(3):
        response = httpx.post(router.url + "/v1/completions", json=body, timeout=30)
        outcome.add("ok" if response.status_code == 200 else "lost", str(response.status_code))
    assert router.state()["peers"]["redis"] is not True
    try:
        assert identity.ensure_user(admin, ident)
        made = time.monotonic()
        state = contract.state_key(cluster, ident.router)
        wait_until(lambda: admin.get(state) is not None, 15, "the router's state in Redis")
        recovery_s = time.monotonic() - made
        wait_until(
            lambda: admin.xlen(contract.events_stream(cluster)) > 0, 10, "the router's events"
        )
        own_metrics = contract.router_metrics_stream(cluster, ident.router)
        wait_until(lambda: admin.xlen(own_metrics) > 0, 10, "the router's own metrics")
        pubsub = admin.pubsub(ignore_subscribe_messages=True)
        pubsub.subscribe(contract.peers_channel(cluster))
        heartbeat = wait_until(
            lambda: pubsub.get_message(timeout=0.5), 10, "a peer heartbeat published"
        )
        pubsub.close()
        assert heartbeat["data"].startswith(b"sy-peers-v2 ")
        as_router = redis.Redis.from_url(ident.url(drill_redis.url))
        forbidden = _forbidden(cluster, ident.router)
        refused = [command[:2] for command in forbidden if _refused(as_router, *command)]
        listens = as_router.pubsub()
        listens.subscribe(contract.CONFIG_CHANNEL)  # listening to config notices is allowed
        assert listens.get_message(timeout=5)["type"] == "subscribe"
        listens.close()
        as_router.close()
        assert admin.exists(contract.state_key("other-cluster", ident.router)) == 0
        assert admin.xlen(contract.EVENTS_STREAM) == 0
    finally:
        identity.delete_user(admin, ident)
        admin.close()
    record(
        "redis acl: a router confined to its cluster",
        outcome,
        recovery_s,
        notes=f"router served while Redis refused it (no user yet); {len(refused)} of "
        f"{len(forbidden)} writes/reads outside its cluster refused with NOPERM; "
        "recovery = user made -> the router's state in Redis",
    )
    assert outcome.succeeded == outcome.sent == 3
    assert refused == [command[:2] for command in forbidden]
