"""Drill: two routers with replica sync on one fleet; their Redis stops for 5 s under load
(a private redis-server; the machine's shared one is never touched).

Routing is unaffected (every request to either router succeeds), each router drops its
peer's requests instead of keeping them pending forever, and once Redis is back the routers
hear each other again and apply each other's requests. After the load, no request of
either router is left in flight anywhere (nothing leaked through the outage).
"""

from __future__ import annotations

import asyncio
import threading
import time

from devharness import Router, wait_until
from tests.drills.clients import Load
from tests.drills.helpers import drill_config
from tests.drills.report import Outcome, record
from tests.router.helpers import PEER_ENV

OUTAGE_S = 5.0


def _load(router: Router, stop: threading.Event, box: list[Outcome]) -> threading.Thread:
    load = Load(router.url + "/v1/completions", concurrency=2, max_tokens=8, pause_s=0.05)
    thread = threading.Thread(
        target=lambda: box.append(asyncio.run(load.run(until=stop.is_set))), daemon=True
    )
    thread.start()
    return thread


def _peers(router: Router) -> dict:
    return router.state()["peers"]


def _hears(router: Router, other: Router) -> bool:
    return f"r{other.port}" in _peers(router)["peers"]


def _applied(router: Router) -> int:
    return _peers(router)["counts"].get("applied:dispatch", 0)


def test_peer_sync_survives_a_redis_outage(drill_fleet, router_factory, drill_redis):
    document = drill_config(drill_fleet, "lmetric", peer_timeout_s=1.0)
    first = router_factory(document, redis_url=drill_redis.url, env=PEER_ENV)
    second = router_factory(document, redis_url=drill_redis.url, env=PEER_ENV)
    wait_until(lambda: _hears(first, second) and _hears(second, first), 15, "peers heard")
    stop, boxes = threading.Event(), [list[Outcome](), list[Outcome]()]
    loaders = [_load(router, stop, box) for router, box in zip((first, second), boxes, strict=True)]
    wait_until(lambda: _applied(first) > 0 and _applied(second) > 0, 15, "peers applied")
    drill_redis.stop()
    wait_until(
        lambda: not _peers(first)["peers"] and not _peers(second)["peers"],
        15,
        "peers dropped while Redis is down",
    )
    time.sleep(OUTAGE_S)
    before = (_applied(first), _applied(second))
    drill_redis.start()
    back = time.monotonic()
    wait_until(lambda: _hears(first, second) and _hears(second, first), 30, "peers heard again")
    heard_s = time.monotonic() - back
    wait_until(
        lambda: _applied(first) > before[0] and _applied(second) > before[1],
        15,
        "peers applied again",
    )
    stop.set()
    for loader in loaders:
        loader.join(timeout=60)
    outcome = boxes[0][0]
    outcome.merge(boxes[1][0])
    wait_until(
        lambda: all(
            i["in_flight"] == 0 for r in (first, second) for i in r.state()["snapshot"]["instances"]
        ),
        10,
        "nothing leaked",
    )
    counts = [_peers(r)["counts"] for r in (first, second)]
    failed = sum(c.get("dropped:publish_failed", 0) for c in counts)
    record(
        "replica sync: redis stopped 5 s",
        outcome,
        heard_s,
        notes=f"2 routers with peer sync under load; peers forgotten during the outage "
        f"(so publishing stops; {failed} publishes failed and were counted), none "
        "of either router's requests left in flight after; recovery = redis back "
        "-> routers hear each other again (subscriber restart backoff)",
    )
    assert outcome.sent > 0 and outcome.succeeded == outcome.sent, outcome.lost_examples
