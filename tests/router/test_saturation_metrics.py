"""The autoscaling signal on a live router's /metrics: queued prefill seconds rise while
the engines hold requests unanswered and fall back once they are gone; the healthy
instance count follows the fleet (KV pressure's arithmetic: tests/routing/test_saturation.py)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import httpx
import pytest

from devharness import Fleet, wait_until
from tests.fleets import fast_fleet
from tests.router.helpers import MODEL, router_config, scrape_total

PENDING = "switchyard_router_fleet_pending_prefill_seconds"


@pytest.fixture
def hanging_fleet() -> Iterator[Fleet]:
    with fast_fleet(2) as fleet:
        yield fleet


def _send(url: str) -> None:
    with contextlib.suppress(httpx.HTTPError):  # the engine never answers: the client leaves
        httpx.post(
            url + "/v1/completions",
            timeout=4,
            json={"model": MODEL, "prompt": "queued work " * 400, "max_tokens": 2},
        )


def test_the_router_exports_the_fleets_saturation(hanging_fleet, router_factory):
    router = router_factory(router_config(hanging_fleet, "round_robin"))
    assert scrape_total(router.url, "switchyard_router_fleet_instances") == 2
    assert scrape_total(router.url, PENDING) == 0.0
    for index in range(2):
        hanging_fleet.fault(index, "hang")
    clients = [threading.Thread(target=_send, args=(router.url,)) for _ in range(2)]
    for client in clients:
        client.start()
    try:
        wait_until(lambda: scrape_total(router.url, PENDING) > 0, 10, "queued prefill seen")
    finally:
        for client in clients:
            client.join()
        hanging_fleet.recover()
    wait_until(lambda: scrape_total(router.url, PENDING) == 0, 15, "the queue drained")
