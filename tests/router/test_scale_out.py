"""Two router processes in front of one cluster, as users scale out."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter

import httpx

from tests.router.helpers import MODEL, router_config


async def _traffic(urls: list[str], count: int, concurrency: int) -> list[tuple[str, str]]:
    """``count`` streams alternating between routers; returns (router, instance) pairs."""
    gate = asyncio.Semaphore(concurrency)

    async def one(client: httpx.AsyncClient, k: int) -> tuple[str, str]:
        url = urls[k % len(urls)]
        body = {
            "model": MODEL,
            "prompt": f"user {k} asks " + "about things " * 40,
            "max_tokens": 120,  # long enough that a scrape catches the other router's
            "stream": True,
        }
        async with gate, client.stream("POST", url + "/v1/completions", json=body) as resp:
            await resp.aread()
            assert resp.status_code == 200
            return url, resp.headers["x-switchyard-instance"]

    async with httpx.AsyncClient(timeout=60) as client:
        return await asyncio.gather(*(one(client, k) for k in range(count)))


def test_two_routers_share_one_cluster_and_stay_balanced(fleet, router_factory):
    document = router_config(fleet, "lmetric")
    document["router"]["scrape_interval_s"] = 0.1
    first, second = router_factory(document), router_factory(document)
    sightings: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        # Evidence that a router sees load it did not send: an engine's scraped running
        # count above the router's own in-flight count for that instance.
        while not stop.is_set():
            for inst in second.state()["snapshot"]["instances"]:
                if inst["running"] is not None and inst["running"] > inst["in_flight"]:
                    sightings.append(inst["running"] - inst["in_flight"])
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        results = asyncio.run(_traffic([first.url, second.url], 160, 16))
    finally:
        stop.set()
        watcher.join()
    per_router = Counter(router for router, _ in results)
    assert per_router[first.url] == per_router[second.url] == 80
    per_instance = Counter(instance for _, instance in results)
    assert set(per_instance) == {"i0", "i1", "i2", "i3"}
    mean = len(results) / 4
    assert all(0.5 * mean <= n <= 1.5 * mean for n in per_instance.values()), per_instance
    assert sightings, "the second router never saw the first router's load in the scrapes"
