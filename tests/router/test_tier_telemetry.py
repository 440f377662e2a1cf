"""Global KV tier traffic from the engines' /metrics to the router's state snapshot and the
control plane's merged cluster snapshot; absent for a cluster without a tier."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

import engine_interface as ei
from controlplane.realtime.snapshot import merge_cluster
from devharness import Fleet, wait_until
from router_worker.contract.telemetry import StateSnapshot
from tests.router.helpers import MODEL, kv_fleet, router_config

PROMPT = "tiered prefix " * 120


@pytest.fixture
def tier_fleet() -> Iterator[Fleet]:
    with kv_fleet(2, "--global-tier-blocks", "100000") as fleet:
        yield fleet


def _snapshot(router) -> StateSnapshot:
    return StateSnapshot.model_validate(router.state()["snapshot"])


def _send_twice(router) -> None:
    for _ in range(2):  # round robin: the second goes to the other instance, a tier hit
        response = httpx.post(
            router.url + "/v1/completions",
            timeout=10,
            json={"model": MODEL, "prompt": PROMPT, "max_tokens": 2},
        )
        assert response.status_code == 200


def test_tier_hits_and_bytes_reach_the_cluster_snapshot(tier_fleet, router_factory):
    router = router_factory(router_config(tier_fleet, "round_robin"))
    _send_twice(router)
    hits = sum(tier_fleet.metric(k, ei.EXTERNAL_PREFIX_HITS.total) for k in range(2))
    read = sum(tier_fleet.metric(k, ei.TIER_READ_BYTES.total) for k in range(2))
    assert hits > 0 and read > 0

    def reported() -> bool:
        return sum(i.tier_hit_tokens or 0 for i in _snapshot(router).instances) == hits

    wait_until(reported, 10, "tier hits in the router's snapshot")
    merged = merge_cluster("test", [_snapshot(router)])
    assert merged["tier"] == {"hit_tokens": hits, "bytes_read": read}
    assert all(i["tier_bytes_read"] is not None for i in merged["instances"])


def test_a_cluster_without_a_tier_reports_none(fleet, router_factory):
    router = router_factory(router_config(fleet, "round_robin"))
    _send_twice(router)
    wait_until(
        lambda: all(i.kv_usage is not None for i in _snapshot(router).instances),
        10,
        "a scrape of every instance",
    )
    snapshot = _snapshot(router)
    assert all(i.tier_hit_tokens is None and i.tier_bytes_read is None for i in snapshot.instances)
    # what each engine reports of itself reaches the snapshot as it is: its preemptions
    # (a counter, 0 here: a number, not the None of an instance never scraped)
    preempted = {
        i.name: fleet.metric(int(i.name[1:]), ei.PREEMPTIONS.total) for i in snapshot.instances
    }
    assert {i.name: i.preemptions for i in snapshot.instances} == preempted
    assert merge_cluster("test", [snapshot])["tier"] is None
