"""Config hot-swap and admin endpoints; telemetry to a private Redis that goes away."""

from __future__ import annotations

import asyncio
import re

import httpx
import redis

from devharness import wait_until, wait_until_async
from router_worker.contract import telemetry as contract
from router_worker.stages import STAGES
from tests.router.helpers import MODEL, router_config, stream_entries


async def _stream_load(
    url: str, results: list[tuple[int, str]], stop: asyncio.Event, concurrency: int
) -> None:
    """Streams back to back until ``stop``; appends (status, policy) per request."""
    body = {"model": MODEL, "prompt": "hot swap " * 60, "max_tokens": 10, "stream": True}

    async def worker(client: httpx.AsyncClient) -> None:
        while not stop.is_set():
            async with client.stream("POST", url, json=body) as response:
                text = (await response.aread()).decode()
                ok = response.status_code == 200 and '"error"' not in text
                ok = ok and text.rstrip().endswith("[DONE]")
                results.append(
                    (
                        200 if ok else response.status_code,
                        response.headers.get("x-switchyard-policy", ""),
                    )
                )

    async with httpx.AsyncClient(timeout=30) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))


def test_config_hot_swap_under_load_drops_nothing(fleet, router_factory):
    router = router_factory(router_config(fleet, "lmetric"))
    new = router_config(fleet, "round_robin", version=2)

    async def scenario() -> list[tuple[int, str]]:
        results: list[tuple[int, str]] = []
        stop = asyncio.Event()
        load = asyncio.create_task(_stream_load(router.url + "/v1/completions", results, stop, 6))
        try:
            # the old policy answers a round of every stream before the swap, and the new
            # one a round after it: the swap lands in the middle of the load
            await wait_until_async(lambda: len(results) >= 12, 30, "the load under lmetric")
            async with httpx.AsyncClient() as client:
                response = await client.post(
                    router.url + "/admin/config", json=new, headers=router.admin_headers
                )
            assert response.status_code == 200 and response.json() == {"applied_version": 2}
            await wait_until_async(
                lambda: sum(policy == "round_robin" for _, policy in results) >= 12,
                30,
                "the load under round_robin",
            )
        finally:
            stop.set()
            await load
        return results

    results = asyncio.run(scenario())
    assert results and all(status == 200 for status, _ in results)
    policies = [policy for _, policy in results]
    assert policies[:12] == ["lmetric"] * 12
    first_rr = policies.index("round_robin")
    # Completion order is not dispatch order, but once the new policy answers, the old
    # one can only finish the few requests that were already in flight (6 workers).
    assert policies[first_rr:].count("lmetric") <= 6


def test_invalid_config_refused_and_old_one_kept(fleet, router_factory):
    router = router_factory(router_config(fleet, "lmetric", version=3))
    url = router.url + "/admin/config"
    assert httpx.post(url, json=router_config(fleet, "round_robin")).status_code == 401
    bad = router_config(fleet, "linear", params={"w": 7}, version=4)
    refused = httpx.post(url, json=bad, headers=router.admin_headers)
    assert refused.status_code == 400 and "w" in refused.json()["error"]["message"]
    older = httpx.post(
        url, json=router_config(fleet, "round_robin", version=2), headers=router.admin_headers
    )
    assert older.status_code == 409
    applied = httpx.get(url, headers=router.admin_headers).json()
    assert applied["version"] == 3 and applied["policy"]["kind"] == "lmetric"
    kinds = [e["kind"] for e in router.state()["recent_events"]]
    assert kinds.count("config_rejected") == 2


def test_canary_arms_split_by_session_and_restrict_instances(fleet, router_factory):
    instances = fleet.instances()
    canary = {
        "arms": [
            {
                "name": "baseline",
                "weight": 50,
                "instances": ["i0", "i1"],
                "policy": {"kind": "round_robin"},
            },
            {
                "name": "candidate",
                "weight": 50,
                "instances": ["i2", "i3"],
                "policy": {"kind": "lmetric"},
            },
        ]
    }
    router = router_factory(router_config(fleet, canary=canary, instances=instances))
    arms: dict[str, set[str]] = {}
    for k in range(16):
        session = f"session-{k}"
        seen = set()
        for _ in range(2):
            response = httpx.post(
                router.url + "/v1/completions",
                headers={"x-session-id": session},
                json={"model": MODEL, "prompt": "x y z", "max_tokens": 1},
            )
            seen.add(
                (
                    response.headers["x-switchyard-arm"],
                    response.headers["x-switchyard-instance"],
                    response.headers["x-switchyard-policy"],
                )
            )
        assert len({arm for arm, _, _ in seen}) == 1  # a session stays in its arm
        for arm, instance, policy in seen:
            arms.setdefault(arm, set()).add(instance)
            assert policy == ("round_robin" if arm == "baseline" else "lmetric")
    assert set(arms) == {"baseline", "candidate"}
    assert arms["baseline"] <= {"i0", "i1"} and arms["candidate"] <= {"i2", "i3"}


def test_drain_stops_new_requests_to_the_instance(fleet, router_factory):
    router = router_factory(router_config(fleet, "round_robin"))
    drained = httpx.post(router.url + "/admin/instances/i2/drain", headers=router.admin_headers)
    assert drained.json() == {"instance": "i2", "health": "draining"}
    seen = {
        httpx.post(
            router.url + "/v1/completions",
            json={"model": MODEL, "prompt": "drain me", "max_tokens": 1},
        ).headers["x-switchyard-instance"]
        for _ in range(9)
    }
    assert seen == {"i0", "i1", "i3"}
    assert (
        httpx.post(
            router.url + "/admin/instances/zz/drain", headers=router.admin_headers
        ).status_code
        == 404
    )
    assert httpx.get(router.url + "/admin/state").status_code == 401


def _events(client: redis.Redis) -> list[contract.EventRecord]:
    entries = stream_entries(client, contract.events_stream("test"))
    return [contract.EventRecord.from_stream_fields(fields) for _, fields in entries]


def test_telemetry_survives_redis_outage_and_flushes_events(fleet, router_factory, private_redis):
    router = router_factory(router_config(fleet, "lmetric"), redis_url=private_redis.url)
    name = f"r{router.port}"
    client = redis.Redis(port=private_redis.port)
    key = contract.state_key("test", name)
    wait_until(lambda: client.get(key) is not None, 10, "state snapshot in Redis")
    raw = client.get(key)
    assert raw is not None
    snapshot = contract.loads_state(raw)
    assert {i.name for i in snapshot.instances} == {"i0", "i1", "i2", "i3"}
    assert 0 < client.ttl(key) <= contract.STATE_TTL_S
    body = {"model": MODEL, "prompt": "telemetry " * 40, "max_tokens": 3, "stream": True}
    with httpx.stream("POST", router.url + "/v1/completions", json=body) as response:
        response.read()
    own = contract.router_metrics_stream("test", name)  # its own stream, nobody else's

    def arms() -> list[contract.ArmMetrics]:
        entries = stream_entries(client, own)
        records = [contract.MetricsRecord.from_stream_fields(f) for _, f in entries]
        return [r.arms["default"] for r in records if "default" in r.arms]

    # the request's record: a flush before the request ended holds none of it
    wait_until(lambda: sum(a.requests for a in arms()) > 0, 30, "the request's metrics record")
    assert client.xlen(contract.metrics_stream("test")) == 0
    recorded = arms()
    assert sum(a.requests for a in recorded) == 1 and recorded[0].policy == "lmetric"
    assert any(a.ttft_s for a in recorded)
    kinds = {e.kind for e in _events(client)}
    assert {"config_applied", "router_started"} <= kinds

    private_redis.stop()
    client.close()
    for k in range(5):  # routing continues without Redis
        response = httpx.post(
            router.url + "/v1/completions",
            json={"model": MODEL, "prompt": f"no redis {k}", "max_tokens": 2},
        )
        assert response.status_code == 200
    httpx.post(router.url + "/admin/instances/i3/drain", headers=router.admin_headers)
    wait_until(lambda: router.state()["telemetry"]["redis"] is False, 5, "outage noticed")
    assert router.state()["telemetry"]["buffered_events"] >= 1

    private_redis.start()  # empty: nothing was saved
    client = redis.Redis(port=private_redis.port)
    wait_until(
        lambda: any(e.kind == "health" and e.payload["instance"] == "i3" for e in _events(client)),
        10,
        "buffered events flushed",
    )
    ids = [e.id for e in _events(client)]
    assert len(ids) == len(set(ids))
    assert router.state()["telemetry"]["dropped_total"] == 0
    client.close()


def test_router_metrics_endpoint(fleet, router_factory):
    router = router_factory(router_config(fleet, "lmetric"))
    httpx.post(
        router.url + "/v1/completions",
        json={"model": MODEL, "prompt": "m " * 50, "max_tokens": 2, "stream": True},
    )
    text = router.metrics()
    for name in (
        "switchyard_router_requests_total",
        "switchyard_router_decision_seconds",
        "switchyard_router_hashing_seconds",
        "switchyard_router_ttft_seconds",
        "switchyard_router_tokenize_seconds",
    ):
        assert name in text
    assert 'policy="lmetric"' in text and 'tier="approx"' in text
    # the router's own share of the streamed request's first chunk, observed once
    assert "switchyard_router_overhead_seconds_count 1.0" in text
    lag = re.search(r"^switchyard_router_loop_lag_seconds_count (\S+)$", text, re.M)
    assert lag and float(lag.group(1)) > 0  # sampled every 10 ms since the router started
    for generation in "012":  # the GC's pauses, each generation's series there from the start
        assert f'switchyard_router_gc_pause_seconds_count{{generation="{generation}"}}' in text
    # Where the router's time goes, stage by stage: one observation per answered request
    # (streamed or not), each stage in its own series.
    httpx.post(
        router.url + "/v1/completions",
        json={"model": MODEL, "prompt": "n " * 50, "max_tokens": 2},
    ).raise_for_status()
    text = router.metrics()
    for stage in STAGES:
        count = re.search(
            rf'^switchyard_router_stage_seconds_count{{stage="{stage}"}} (\S+)$', text, re.M
        )
        total = re.search(
            rf'^switchyard_router_stage_seconds_sum{{stage="{stage}"}} (\S+)$', text, re.M
        )
        assert count and float(count.group(1)) == 2.0, stage
        assert total and float(total.group(1)) >= 0.0, stage
    engine = re.search(r'^switchyard_router_stage_seconds_sum{stage="engine"} (\S+)$', text, re.M)
    assert engine and float(engine.group(1)) > 0.0
