"""Drill: poison entries in the telemetry streams (a private redis-server).

A router under steady load writes its events and metrics records to Redis while this test
slips poison between them, in three waves: a malformed hotspot payload, times beyond year
9999 or NaN, a router name over 64 characters, NUL characters, numbers beyond Postgres'
columns, a cluster that does not exist, entries that are not JSON at all. Between the
waves an instance is drained and restored (health events), a burst of requests behind one
hot prefix trips the hotspot detector (hotspot events), and ingest runs as beat runs it.

Every request succeeds; every event the router produced reaches Postgres and every
request it served is counted once in the rollups (no lost audit or telemetry events);
every poison entry is quarantined and counted; nothing stays pending in either stream.
"""

from __future__ import annotations

import json
import math
import threading
import time
import uuid
from typing import Any, cast

import pytest
import redis
from django.db.models import Sum

from controlplane.models import (
    ArmMetricRollup,
    Cluster,
    HotspotEvent,
    RouterDeployment,
    RouterEvent,
)
from controlplane.services import ingest
from devharness import Router, wait_until
from router_worker.contract.telemetry import EVENTS_STREAM, METRICS_STREAM
from tests.drills.clients import MODEL
from tests.drills.helpers import background_load, drain, drill_config, hot_burst
from tests.drills.report import Outcome, record

CLUSTER = "drill"
WAVES = 3


def event(**overrides: Any) -> dict[str, Any]:
    base = {
        "id": uuid.uuid4().hex,
        "cluster": CLUSTER,
        "router": "poison",
        "kind": "health",
        "at": time.time(),
        "payload": {},
    }
    return {**base, **overrides}


def hotspot(**payload: Any) -> dict[str, Any]:
    numbers = {
        "transition": "confirmed",
        "prefix_class": "c",
        "prefix_hash": "h",
        "x": 1.0,
        "x_bar": 1.0,
        "m": 1,
        "m_bar": 3,
        "window": 30.0,
    }
    return event(kind="hotspot", payload={**numbers, **payload})


def metrics(**overrides: Any) -> dict[str, Any]:
    base = {
        "id": uuid.uuid4().hex,
        "cluster": CLUSTER,
        "router": "poison",
        "start": time.time(),
        "end": time.time() + 1,
        "arms": {"poison": {"policy": "lmetric", "requests": 1}},
    }
    return {**base, **overrides}


def poison_wave() -> list[tuple[str, Any]]:
    return [
        (EVENTS_STREAM, hotspot(transition="melted")),
        (EVENTS_STREAM, event(kind="hotspot", payload={"transition": "confirmed"})),
        (EVENTS_STREAM, hotspot(m=2**40)),
        (EVENTS_STREAM, event(at=1e20)),
        (EVENTS_STREAM, event(at=math.nan)),
        (EVENTS_STREAM, event(router="r" * 65)),
        (EVENTS_STREAM, event(router="nul\x00router")),
        (EVENTS_STREAM, event(payload={"ratio": math.inf})),
        (EVENTS_STREAM, event(cluster="no-such-cluster")),
        (EVENTS_STREAM, "{not json"),
        (METRICS_STREAM, metrics(start=1e20)),
        (METRICS_STREAM, metrics(arms={"poison": {"policy": "x", "requests": 2**40}})),
        (METRICS_STREAM, metrics(arms={"poison": {"policy": "x", "ttft_s": [math.nan]}})),
        (METRICS_STREAM, "\xff not json"),
    ]


def inject(client: redis.Redis, entries: list[tuple[str, Any]]) -> None:
    for stream, document in entries:
        data = document if isinstance(document, str) else json.dumps(document, allow_nan=True)
        client.xadd(stream, {"data": data})


def ingest_round(client: redis.Redis) -> None:
    """What beat does every second or two: both ingest tasks, until nothing is left."""
    while ingest.ingest_events(client).read + ingest.ingest_metrics(client).read:
        pass


def stored_ids() -> set[str]:
    return set(RouterEvent.objects.values_list("event_id", flat=True)) | set(
        HotspotEvent.objects.values_list("event_id", flat=True)
    )


def rollup_requests() -> int:
    total = ArmMetricRollup.objects.filter(cluster__name=CLUSTER).aggregate(n=Sum("requests"))
    return total["n"] or 0


def flushed(router: Router) -> bool:
    return router.state()["telemetry"]["buffered_events"] == 0


@pytest.mark.django_db(transaction=True)
def test_poison_entries_are_quarantined_and_no_valid_entry_is_lost(
    drill_fleet, router_factory, drill_redis
):
    cluster = Cluster.objects.create(name=CLUSTER, model=MODEL, gpu_type="h20")
    router = router_factory(drill_config(drill_fleet, "lmetric"), redis_url=drill_redis.url)
    # Only a cluster's own routers' metrics are ingested.
    RouterDeployment.objects.create(
        cluster=cluster, name=f"r{router.port}", host="127.0.0.1", port=router.port
    )
    client = redis.Redis.from_url(drill_redis.url)
    wait_until(lambda: router.state()["telemetry"]["redis"], 10, "telemetry connected")
    stop, box = threading.Event(), list[Outcome]()
    loader = background_load(router, stop, box)
    poison, burst = 0, Outcome()
    for number in range(WAVES):
        wave = poison_wave()
        drain(router, "i3", True)
        inject(client, wave[: len(wave) // 2])
        drain(router, "i3", False)
        if number == 1:
            burst = hot_burst(router)  # real hotspot transitions amid the poison
        inject(client, wave[len(wave) // 2 :])
        poison += len(wave)
        time.sleep(1.0)
        ingest_round(client)
    last_poison = time.monotonic()
    stop.set()
    loader.join(timeout=60)
    outcome: Outcome = box[0]
    outcome.merge(burst)
    wait_until(lambda: flushed(router), 20, "router events flushed")

    def caught_up() -> bool:
        ingest_round(client)
        return rollup_requests() == outcome.sent

    wait_until(caught_up, 30, "every request counted in the rollups")
    recovery_s = time.monotonic() - last_poison
    produced = router.state()["recent_events"]
    ours = [e for e in produced if e["cluster"] == CLUSTER]
    missing = [e for e in ours if e["id"] not in stored_ids()]
    raw_counts = cast("dict[bytes, bytes]", client.hgetall(ingest.QUARANTINE_COUNTS))
    counts = {k.decode(): int(v) for k, v in raw_counts.items()}
    quarantined = sum(counts.values())
    pending = [client.xpending(s, ingest.GROUP)["pending"] for s in (EVENTS_STREAM, METRICS_STREAM)]
    client.close()
    record(
        "poison entries in the telemetry streams",
        outcome,
        recovery_s,
        notes=f"{poison} poison entries in {WAVES} waves between the router's own; "
        f"{quarantined} quarantined; {len(ours) - len(missing)}/{len(ours)} router "
        f"events in Postgres; {rollup_requests()}/{outcome.sent} requests in the "
        "rollups; recovery = last poison -> ingest caught up",
        poison_sent=poison,
        quarantined=quarantined,
        events_produced=len(ours),
        events_in_postgres=len(ours) - len(missing),
    )
    assert outcome.succeeded == outcome.sent, outcome.lost_examples
    assert not missing, missing[:3]
    assert sum(e["kind"] == "health" for e in ours) >= 2 * WAVES
    assert any(e["kind"] == "hotspot" for e in ours)
    # events of a cluster the control plane does not know are quarantined too
    assert quarantined == poison + len(produced) - len(ours), counts
    assert pending == [0, 0]
