"""Drill: Redis stopped for 10 s under steady load (a private redis-server; the machine's
shared one is never touched).

Routing is unaffected (every request succeeds). Health events (an instance drained and
restored) and hotspot events (a hot-prefix burst) produced during the outage stay
buffered in the router and all reach Postgres through the ingest once Redis is back.
"""

from __future__ import annotations

import threading
import time

import pytest
import redis

from controlplane.models import Cluster, HotspotEvent, RouterEvent
from controlplane.services.ingest import ingest_events
from devharness import wait_until
from tests.drills.clients import MODEL
from tests.drills.helpers import background_load, drain, drill_config, hot_burst
from tests.drills.report import Outcome, record

OUTAGE_S = 10.0


def ingest_all(client: redis.Redis) -> None:
    while ingest_events(client).read:
        pass


def stored_ids() -> set[str]:
    return set(RouterEvent.objects.values_list("event_id", flat=True)) | set(
        HotspotEvent.objects.values_list("event_id", flat=True)
    )


@pytest.mark.django_db(transaction=True)
def test_redis_outage_loses_no_events(drill_fleet, router_factory, drill_redis):
    Cluster.objects.create(name="drill", model=MODEL, gpu_type="h20")
    router = router_factory(drill_config(drill_fleet, "lmetric"), redis_url=drill_redis.url)
    client = redis.Redis.from_url(drill_redis.url)
    wait_until(lambda: router.state()["telemetry"]["redis"], 10, "telemetry connected")
    stop, box = threading.Event(), list[Outcome]()
    loader = background_load(router, stop, box)
    time.sleep(1.0)
    drill_redis.stop()
    started = time.time()
    wait_until(lambda: not router.state()["telemetry"]["redis"], 10, "router to notice")
    burst_start = time.monotonic()
    burst = hot_burst(router)
    burst_s = time.monotonic() - burst_start
    drain(router, "i3", True)
    drain(router, "i3", False)
    time.sleep(max(0.0, OUTAGE_S - (time.time() - started)))
    produced = [e for e in router.state()["recent_events"] if e["at"] >= started]
    buffered = router.state()["telemetry"]["buffered_events"]
    drill_redis.start()
    back = time.monotonic()
    wait_until(
        lambda: (
            router.state()["telemetry"]["buffered_events"] == 0
            and router.state()["telemetry"]["redis"]
        ),
        30,
        "buffer flushed",
    )
    flushed_s = time.monotonic() - back
    ingest_all(client)
    stop.set()
    loader.join(timeout=60)
    client.close()
    outcome = box[0]
    outcome.merge(burst)
    ids = stored_ids()
    missing = [e for e in produced if e["id"] not in ids]
    kinds = sorted(
        {
            e["kind"] + (f":{e['payload'].get('transition')}" if e["kind"] == "hotspot" else "")
            for e in produced
        }
    )
    record(
        "redis stopped 10 s",
        outcome,
        flushed_s,
        notes=f"{len(produced)} events during outage ({', '.join(kinds)}), "
        f"{buffered} buffered, {len(produced) - len(missing)} in Postgres after; "
        f"recovery = redis back -> buffer flushed; hot burst took {burst_s:.1f} s",
        events_during_outage=len(produced),
        events_in_postgres=len(produced) - len(missing),
    )
    assert outcome.succeeded == outcome.sent, outcome.lost_examples
    assert any(e["kind"] == "health" for e in produced)
    assert not missing, missing[:3]
    assert router.state()["telemetry"]["dropped_total"] == 0
