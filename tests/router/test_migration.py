"""DualMap's queued-request migration in the live router, against real enginesim processes:
a request queued (no first byte) behind a long one on a slow instance is taken back and
sent to its alternative, and its client gets one complete response from there."""

from __future__ import annotations

import asyncio

import httpx

import engine_interface as ei
from devharness import wait_until
from tests.router.helpers import MODEL, router_config, scrape_total

MAX_TOKENS = 12


def body(ids: list[int]) -> dict:
    return {"model": MODEL, "prompt": ids, "max_tokens": MAX_TOKENS, "stream": True}


async def stream(client: httpx.AsyncClient, url: str, ids: list[int]) -> tuple[int, str, str]:
    async with client.stream("POST", url, json=body(ids)) as response:
        text = (await response.aread()).decode()
        return response.status_code, response.headers.get("x-switchyard-instance", ""), text


def migrations(router) -> float:
    return scrape_total(router.url, "switchyard_router_migrations_total")


def tokens_in(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.startswith("data: {") and '"text"' in line)


def run_scenario(fleet, router, base: int) -> tuple[list[tuple[int, str, str]], float]:
    # The router has seen no first token: it estimates 10 000 prefill tokens/s. A (9000
    # tokens, 0.9 s) and B (1000 tokens sharing A's first 256, so the same hash key and a
    # hit on A's instance: 0.97 s) both stay on the affinity candidate within the 1 s SLO.
    # 0.4 s later both would miss it there; B would make it on the idle alternative.
    a = list(range(base, base + 9000))
    b = a[:256] + list(range(base + 50_000, base + 50_744))
    c = list(range(base + 90_000, base + 90_032))
    url = router.url + "/v1/completions"

    def in_flight(count: int) -> None:
        wait_until(lambda: router.state()["limiter"]["active"] >= count, 10, f"{count} in flight")

    async def scenario() -> list[tuple[int, str, str]]:
        async with httpx.AsyncClient(timeout=60) as client:
            first = asyncio.create_task(stream(client, url, a))
            await asyncio.to_thread(in_flight, 1)  # A routed before B arrives
            second = asyncio.create_task(stream(client, url, b))
            await asyncio.to_thread(in_flight, 2)
            # Scenario time, not a wait for something to happen: B must have waited long
            # enough to miss the SLO where it is (from 0.03 s) and not so long that its
            # alternative cannot make it either (0.9 s). C's dispatch runs the check.
            await asyncio.sleep(0.3)
            third = asyncio.create_task(stream(client, url, c))
            await asyncio.to_thread(
                wait_until, lambda: migrations(router) >= 1, 10, "a migration", None
            )
            for index in (0, 1):
                await asyncio.to_thread(fleet.fault, index, "recover")
            return [await first, await second, await third]

    for index in (0, 1):
        fleet.fault(index, "slow", factor=200)
    try:
        return asyncio.run(scenario()), migrations(router)
    finally:
        for index in (0, 1):
            fleet.fault(index, "recover")


def aborts(fleet, index: int) -> float:
    return fleet.metric(index, ei.REQUEST_SUCCESS.total, finished_reason="abort")


def test_a_queued_request_migrates_and_its_client_gets_one_complete_response(fleet, router_factory):
    document = router_config(
        fleet, "dualmap", {"slo_ttft_s": 1.0}, instances=fleet.instances()[0:2]
    )
    router = router_factory(document)
    before = [aborts(fleet, 0), aborts(fleet, 1)]
    (a, b, c), moved = run_scenario(fleet, router, 10_000)
    # B moves; C (queued behind A when B is re-sent) may follow if it has waited enough
    assert moved >= 1, router.log()[-3000:]
    for status, instance, text in (a, b, c):
        assert status == 200 and instance in ("i0", "i1")
        assert text.rstrip().endswith("data: [DONE]") and '"error"' not in text
        assert tokens_in(text) == MAX_TOKENS  # one complete answer, no duplicate tokens
    assert b[1] != a[1]  # B left A's instance for its alternative
    source = int(a[1][1:])
    wait_until(
        lambda: aborts(fleet, source) >= before[source] + 1,
        20,  # a bound, not a target: the engine notices the closed stream at its next step
        "the source engine to record the abort of the moved request",
    )
    assert router.state()["snapshot"]["instances"][source]["in_flight"] == 0


def test_without_migration_the_queued_request_waits_on_its_instance(fleet, router_factory):
    document = router_config(
        fleet,
        "dualmap",
        {"slo_ttft_s": 1.0, "migrate_queued": False},
        instances=fleet.instances()[0:2],
    )
    router = router_factory(document)
    a = list(range(20_000, 29_000))
    b = a[:256] + list(range(70_000, 70_744))

    async def scenario() -> list[tuple[int, str, str]]:
        async with httpx.AsyncClient(timeout=60) as client:
            return list(
                await asyncio.gather(
                    stream(client, router.url + "/v1/completions", a),
                    stream(client, router.url + "/v1/completions", b),
                )
            )

    (a_res, b_res) = asyncio.run(scenario())
    assert a_res[1] == b_res[1] and migrations(router) == 0
