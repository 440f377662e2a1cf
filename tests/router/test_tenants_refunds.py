"""A request refused after it passed its tenant's quota (shed, its tenant's queue full,
timed out in the queue, its client gone while it waited, refused by the engine) is given
its charge back, in Redis too, whichever of the cluster's routers refused it: only the
requests served count against a quota."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import redis

from devharness import wait_until
from router_worker.contract.config import parse_config
from router_worker.errors import BackOff
from router_worker.flow_gate import FlowGate, RequestClass
from router_worker.metrics import RouterMetrics
from router_worker.quota import SharedQuota
from router_worker.routing import ClusterState
from tests.router.client_keys import key_hash
from tests.router.helpers import MODEL, router_config
from tests.router.test_tenants_quota import _fresh_minute
from tests.routing.helpers import add_pending, cluster

LIMIT = 2
TENANTS = [
    {"name": "batch", "priority": "sheddable", "requests_per_minute": LIMIT},
    {"name": "full", "requests_per_minute": LIMIT, "max_queued": 0},
    {"name": "patient", "requests_per_minute": LIMIT},
]


def _gate(redis_url: str, state: Callable[[], ClusterState | None]) -> FlowGate:
    """One router's flow control, its quota shared through ``redis_url``."""
    gate = FlowGate(RouterMetrics(), state)
    gate.quota = SharedQuota(redis_url)
    document = {
        "cluster": "refunds",
        "instances": [{"name": "i0", "url": "http://127.0.0.1:1"}],
        "policy": {"kind": "least_load"},
        "tenants": TENANTS,
        "flow": {"queue_timeout_s": 0.2, "max_backlog_s": 0.5},
    }
    gate.configure(parse_config(document))
    return gate


async def _status(gate: FlowGate, tenant: str) -> int:
    try:
        await gate.admit(RequestClass(tenant, gate.controller.priority_of(tenant, None)), 10, 100)
    except BackOff as refused:
        return refused.status
    return 200


def test_requests_refused_after_the_quota_leave_it_whole_on_every_router(private_redis):
    saturated = cluster(1, tps=1000.0)
    add_pending(saturated, "i0", 10_000)  # 10 s of prefill: saturated
    fleet = {"state": saturated}
    gates = [_gate(private_redis.url, lambda: fleet["state"]) for _ in range(2)]

    async def run() -> dict[str, list[int]]:
        seen: dict[str, list[int]] = {}
        # Three times the limit refused, alternately by both routers.
        seen["batch shed"] = [await _status(gates[n % 2], "batch") for n in range(3 * LIMIT)]
        seen["full queue"] = [await _status(gates[n % 2], "full") for n in range(3 * LIMIT)]
        seen["timed out"] = [await _status(gates[n % 2], "patient") for n in range(LIMIT)]
        waiting = asyncio.create_task(_status(gates[0], "patient"))
        while not gates[0].controller.queued and not waiting.done():  # it waits
            await asyncio.sleep(0.01)
        waiting.cancel()  # its client leaves while it waits
        await asyncio.gather(waiting, return_exceptions=True)
        for gate in gates:
            await gate.quota.settle()
        fleet["state"] = cluster(1)  # calm: what passes the quota goes on
        for tenant in ("batch", "full", "patient"):
            seen[tenant] = [await _status(gates[n % 2], tenant) for n in range(LIMIT + 1)]
        for gate in gates:
            await gate.quota.close()
        return seen

    _fresh_minute()
    seen = asyncio.run(run())
    assert seen["batch shed"] == [503] * 3 * LIMIT
    assert seen["full queue"] == [429] * 3 * LIMIT
    assert seen["timed out"] == [503] * LIMIT
    # Nothing above counted: each tenant still has its whole limit, and no more.
    for tenant in ("batch", "full", "patient"):
        assert seen[tenant] == [200] * LIMIT + [429], tenant


KEY = "syk_refundkey_" + "r" * 40


def _requests_counted(redis_url: str) -> int:
    """The requests Redis counts for the tenant in its minute windows."""
    client = redis.Redis.from_url(redis_url)
    try:
        keys = client.keys("switchyard:quota:test:metered:m:*")
        return sum(int(client.hget(key, "r") or 0) for key in keys)
    finally:
        client.close()


def test_requests_the_engine_refuses_do_not_count_on_either_router(
    fleet, router_factory, private_redis
):
    document = router_config(
        fleet,
        "least_load",
        tenants=[{"name": "metered", "requests_per_minute": LIMIT}],
        client_auth={"required": True, "keys": [{"sha256": key_hash(KEY), "tenant": "metered"}]},
    )
    routers = [router_factory(document, redis_url=private_redis.url) for _ in range(2)]

    def send(n: int, max_tokens: int) -> httpx.Response:
        body = {"model": MODEL, "prompt": "count me", "max_tokens": max_tokens}
        headers = {"Authorization": f"Bearer {KEY}"}
        url = routers[n % 2].url + "/v1/completions"
        return httpx.post(url, json=body, headers=headers, timeout=30)

    _fresh_minute()
    # Past the engine's context: the engine answers 400, the router passes it on.
    refused = [send(n, 10**8) for n in range(LIMIT)]
    assert [r.status_code for r in refused] == [400] * LIMIT
    assert "context length" in refused[0].json()["error"]["message"]
    # The routers send a closed request's refund without waiting: here once it landed.
    wait_until(lambda: _requests_counted(private_redis.url) == 0, 30, "the refunds in Redis")
    served = [send(n, 1).status_code for n in range(LIMIT + 1)]
    assert served == [200] * LIMIT + [429]


BUSY_SCRIPT = """
local start = redis.call('TIME')
local began = start[1] * 1000000 + start[2]
while true do
  local now = redis.call('TIME')
  if now[1] * 1000000 + now[2] - began > tonumber(ARGV[1]) then return 0 end
end
"""


def _quota_scripts_run(client: redis.Redis) -> int:
    """How many times Redis ran a script by its digest (the quota's take and refund)."""
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def test_a_client_leaving_while_redis_counts_its_request_gets_the_charge_back(private_redis):
    """The quota script, once sent, runs whether or not its client stays. Redis is held busy
    (a script of 120 ms, under the router's 250 ms wait) while a request's take is on its
    way, and the request's client leaves meanwhile: the take Redis then runs is followed by
    a refund, and the tenant keeps its whole limit."""
    gate = _gate(private_redis.url, lambda: cluster(1))  # calm: each request goes on at once
    busy = redis.Redis.from_url(private_redis.url)

    async def run() -> list[int]:
        assert await _status(gate, "patient") == 200  # counted; the script loaded
        before = _quota_scripts_run(busy)
        holding = asyncio.create_task(asyncio.to_thread(busy.eval, BUSY_SCRIPT, 0, 120_000))
        await asyncio.sleep(0.03)  # Redis is in the busy script
        leaving = asyncio.create_task(_status(gate, "patient"))
        await asyncio.sleep(0.03)  # its take is sent and waits behind the busy script
        assert not leaving.done()
        leaving.cancel()
        await asyncio.gather(leaving, return_exceptions=True)
        await holding
        # The take, then its refund: two more script runs (a wait on Redis's own count).
        while _quota_scripts_run(busy) < before + 2:
            await asyncio.sleep(0.01)
        await gate.quota.settle()
        return [await _status(gate, "patient") for _ in range(LIMIT)]

    _fresh_minute()
    try:
        after = asyncio.run(asyncio.wait_for(run(), 20))
    finally:
        busy.close()
    # The request whose client left counts not: one more is served, then the limit.
    assert after == [200] * (LIMIT - 1) + [429]
