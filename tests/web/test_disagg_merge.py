"""A disaggregated cluster's pools and decider as the live view gets them: the routers'
reports merged (router_worker's split counts, the engines' KV reads) and aggregated by role.
"""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.realtime.snapshot import merge_cluster
from router_worker.contract.telemetry import DisaggregationStats, InstanceSnapshot
from router_worker.core import KV_RATE_WINDOW_S, ScrapeInfo

from .helpers import instance, snapshot


def stats(**counts: int) -> DisaggregationStats:
    return DisaggregationStats(**counts)


def fleet(**overrides: dict[str, Any]) -> list[InstanceSnapshot]:
    """i0 prefill, i1 and i2 decode, i3 both: loads chosen so each sum is telling."""
    specs: dict[str, dict[str, Any]] = {
        "i0": dict(role="prefill", pending=400, batch=1, hit_ratio=0.2, kv_usage=0.1),
        "i1": dict(
            role="decode",
            pending=10,
            batch=7,
            hit_ratio=0.9,
            kv_usage=0.5,
            kv_transfers_in_flight=2,
            kv_bytes_per_s=1e9,
            kv_failed_transfers=1,
        ),
        "i2": dict(
            role="decode",
            batch=5,
            kv_usage=0.3,
            kv_transfers_in_flight=1,
            kv_bytes_per_s=5e8,
            kv_failed_transfers=0,
        ),
        "i3": dict(role="both", pending=100, batch=2, hit_ratio=0.6, kv_usage=0.2),
    }
    for name, extra in overrides.items():
        specs[name] = {**specs[name], **extra}
    return [instance(name, **spec) for name, spec in specs.items()]


def test_the_pools_are_aggregated_by_role_an_instance_of_role_both_in_each() -> None:
    merged = merge_cluster("c", [snapshot("c", "r1", fleet(), disaggregation=stats())])
    prefill, decode = merged["disaggregation"]["pools"].values()
    assert (prefill["instances"], prefill["pending_prefill_tokens"]) == (2, 500)  # i0 + i3
    assert prefill["hit_ratio"] == pytest.approx((0.2 + 0.6) / 2)
    assert (decode["instances"], decode["batch_size"]) == (3, 14)  # i1 + i2 + i3
    assert decode["kv_usage"] == pytest.approx((0.5 + 0.3 + 0.2) / 3)
    assert decode["kv_transfers_in_flight"] == 3
    assert decode["kv_bytes_per_s"] == 1.5e9
    assert decode["kv_failed_transfers"] == 1
    # i0 has no KV connector reads: the prefill pool's are unknown, not zero
    assert prefill["kv_bytes_per_s"] is None


def test_a_down_instance_leaves_the_pools_load_but_its_failed_reads_stay_counted() -> None:
    down = fleet(i1={"health": "down"})
    pools = merge_cluster("c", [snapshot("c", "r1", down, disaggregation=stats())])[
        "disaggregation"
    ]["pools"]
    assert (pools["decode"]["up"], pools["decode"]["instances"]) == (2, 3)
    assert pools["decode"]["batch_size"] == 7  # i2 + i3
    assert pools["decode"]["kv_bytes_per_s"] == 5e8
    assert pools["decode"]["kv_failed_transfers"] == 1


def test_the_routers_decisions_sum_and_the_split_ratio_is_of_their_recent_ones() -> None:
    a = snapshot(
        "c",
        "r1",
        fleet(),
        disaggregation=stats(split=30, colocated=10, recent=40, recent_split=30, fallbacks=2),
    )
    b = snapshot(
        "c",
        "r2",
        fleet(i1={"kv_failed_transfers": 4}),
        disaggregation=stats(split=5, colocated=55, recent=60, recent_split=5, fallbacks=1),
    )
    disagg = merge_cluster("c", [a, b])["disaggregation"]
    assert (disagg["split"], disagg["colocated"], disagg["fallbacks"]) == (35, 65, 3)
    assert disagg["split_ratio"] == pytest.approx(35 / 100)
    # the engines' counters: the same engine seen by both routers, the newest (largest) wins
    assert disagg["transfer_failures"] == 4


def test_no_decision_yet_has_no_split_ratio_and_a_colocated_cluster_no_pools() -> None:
    quiet = merge_cluster("c", [snapshot("c", "r1", fleet(), disaggregation=stats())])
    assert quiet["disaggregation"]["split_ratio"] is None
    plain = merge_cluster("c", [snapshot("c", "r1", [instance("i0", role="both")])])
    assert plain["disaggregation"] is None


def test_the_bytes_read_per_second_are_the_counters_rate_over_the_last_seconds() -> None:
    info = ScrapeInfo()
    info.saw_kv_bytes(100.0, None)
    assert info.kv_bytes_per_s is None  # no KV connector
    info.saw_kv_bytes(100.0, 1000.0)
    assert info.kv_bytes_per_s == 0.0  # one scrape: no rate yet
    info.saw_kv_bytes(101.0, 3000.0)
    info.saw_kv_bytes(102.0, 3000.0)
    assert info.kv_bytes_per_s == pytest.approx(2000 / 2)  # a read between scrapes, smoothed
    info.saw_kv_bytes(102.0 + KV_RATE_WINDOW_S + 1, 3000.0)
    assert info.kv_bytes_per_s == 0.0  # the read left the window
    info.saw_kv_bytes(200.0, 50.0)  # the engine restarted: its counter starts again
    assert info.kv_bytes_per_s == 0.0
