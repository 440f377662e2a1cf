"""A tenant's quota held by two routers together through Redis (one atomic script), and
kept with a bounded overshoot while Redis is down: each router then counts alone, so the
two admit at most twice the limit in a window."""

from __future__ import annotations

import time

import httpx

from tests.router.client_keys import key_hash
from tests.router.helpers import MODEL, router_config

KEY = "syk_quotakey_" + "q" * 40
LIMIT = 4


def _document(fleet) -> dict:
    return router_config(
        fleet,
        "least_load",
        tenants=[{"name": "metered", "requests_per_minute": LIMIT}],
        client_auth={"required": True, "keys": [{"sha256": key_hash(KEY), "tenant": "metered"}]},
    )


def _send(router) -> int:
    body = {"model": MODEL, "prompt": "count me", "max_tokens": 1}
    headers = {"Authorization": f"Bearer {KEY}"}
    return httpx.post(
        router.url + "/v1/completions", json=body, headers=headers, timeout=30
    ).status_code


def _fresh_minute(margin: float = 20.0) -> None:
    """Wait for the next minute window if less than ``margin`` seconds are left of this
    one (``margin`` 60: always), so that all the requests of a step count in one window."""
    left = 60.0 - time.time() % 60.0
    if left < margin:
        time.sleep(left + 0.5)


def test_two_routers_share_one_tenants_limit_and_bound_the_overshoot_without_redis(
    fleet, router_factory, private_redis
):
    first = router_factory(_document(fleet), redis_url=private_redis.url)
    second = router_factory(_document(fleet), redis_url=private_redis.url)
    _fresh_minute()
    statuses = [_send(router) for router in (first, second) * 4]
    assert statuses.count(200) == LIMIT and statuses.count(429) == 8 - LIMIT
    private_redis.stop()
    _fresh_minute(60.0)  # a window neither router has counted in yet
    alone = [_send(router) for router in (first, second) * 4]
    # Each router counts alone: one limit each in the window Redis missed, no more.
    assert alone.count(200) == 2 * LIMIT
    assert [_send(first) for _ in range(LIMIT)] == [429] * LIMIT
