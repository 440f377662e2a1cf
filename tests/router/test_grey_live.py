"""Grey-failure detection in a live router: an enginesim instance slowed under load is
found, drained and, once fast again, probed and restored; the live snapshot, the
Prometheus gauges and the events say so; an operator's override drains an instance."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest

from devharness import Fleet, wait_until
from router_worker.routing.grey import GreyParams
from tests.router.helpers import MODEL, router_config, scrape_total

# Fast settings for a test; the ratios are the defaults.
GREY = {
    "enabled": True,
    "warmup": 10,
    "min_samples": 3,
    "persist_s": 2.0,
    "drain_after_s": 3.0,
    "probe_interval_s": 0.5,
    "restore_probes": 3,
}


def _load(url: str, stop: threading.Event) -> int:
    """Streamed requests, 8 at a time, until ``stop``; returns how many were not 200."""

    async def worker(client: httpx.AsyncClient, k: int, bad: list[int]) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            prompt = " ".join(f"grey{k}-{n}-{i}" for i in range(40))
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 24, "stream": True}
            async with client.stream("POST", url + "/v1/completions", json=body) as response:
                await response.aread()
                if response.status_code != 200 or '"error"' in response.text:
                    bad.append(1)

    async def run() -> int:
        bad: list[int] = []
        async with httpx.AsyncClient(timeout=60) as client:
            await asyncio.gather(*(worker(client, k, bad) for k in range(8)))
        return len(bad)

    return asyncio.run(run())


def _snapshot_of(router, name: str) -> dict:
    return next(i for i in router.state()["snapshot"]["instances"] if i["name"] == name)


def _grey_events(router) -> list[tuple[str, str, str]]:
    events = router.state()["recent_events"]
    return [
        (e["payload"]["instance"], e["payload"]["after"], e["payload"]["cause"])
        for e in events
        if e["kind"] == "grey"
    ]


@pytest.fixture(scope="module")
def real_time_fleet():
    """Engines at real speed: at the suite's 20x time scale a decode step is shorter than
    the router's own scheduling noise, and TPOT measures the noise."""
    with Fleet(4, time_scale=1.0) as started:
        yield started


def test_slowed_instance_is_drained_probed_and_restored(real_time_fleet, router_factory):
    fleet = real_time_fleet
    document = router_config(fleet, "round_robin")
    document["router"]["grey"] = GREY
    router = router_factory(document)
    stop = threading.Event()
    result: list[int] = []
    loader = threading.Thread(target=lambda: result.append(_load(router.url, stop)))
    loader.start()
    try:
        # Each instance's normal is learned first (warm-up, then enough samples to judge).
        learned = 4 * (GREY["warmup"] + GREY["min_samples"] + 5)
        wait_until(
            lambda: scrape_total(router.url, "switchyard_router_requests_total") >= learned,
            60,
            "the instances' normals learned",
        )
        assert all(_snapshot_of(router, f"i{k}")["grey_level"] == 0 for k in range(4))
        fleet.fault(1, "slow", factor=3)
        wait_until(lambda: _snapshot_of(router, "i1")["grey_level"] == 3, 60, "i1 drained")
        assert _snapshot_of(router, "i1")["grey_excess"] > GreyParams().enter_ratio
        # The gauges follow at the next scrape round (the snapshot reads the detector).
        wait_until(
            lambda: (
                scrape_total(router.url, "switchyard_router_instance_grey_level", instance="i1")
                == 3
            ),
            10,
            "the gauge saying i1 is drained",
        )
        fleet.fault(1, "recover")
        wait_until(lambda: _snapshot_of(router, "i1")["grey_level"] == 0, 60, "i1 restored")
    finally:
        fleet.fault(1, "recover")
        stop.set()
        loader.join()
    assert result == [0]  # no client saw an error throughout
    events = _grey_events(router)
    # The router's scheduling noise at this time scale may flag a degraded spell more than
    # once; what matters: i1 drained, then restored by its probes, and nobody else drained.
    path = [e[1:] for e in events if e[0] == "i1"]
    drained = path.index(("drained", "still_slow"))
    assert ("degraded", "persisted") in path[:drained]
    assert ("healthy", "probes_good") in path[drained:]
    assert not [e for e in events if e[0] != "i1" and e[1] == "drained"]


@pytest.mark.parametrize("detecting", [True, False], ids=["detection on", "detection off"])
def test_operator_override_drains_an_instance(fleet, router_factory, detecting):
    """Detection on (the default) or off, an operator's word drains the instance."""
    document = router_config(fleet, "round_robin")
    document["router"]["grey"] = GREY if detecting else {"enabled": False}
    document["instances"][2]["grey_override"] = "drained"
    router = router_factory(document)
    answers = [
        httpx.post(
            router.url + "/v1/completions",
            json={"model": MODEL, "prompt": f"override {k}", "max_tokens": 4},
            timeout=30,
        )
        for k in range(8)
    ]
    assert all(a.status_code == 200 for a in answers)
    assert "i2" not in {a.headers["x-switchyard-instance"] for a in answers}
    assert _snapshot_of(router, "i2")["grey_level"] == 3
    assert ("i2", "drained", "operator") in _grey_events(router)
