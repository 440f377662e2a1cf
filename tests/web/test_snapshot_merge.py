"""The pure merge of several routers' snapshots into one cluster snapshot."""

from __future__ import annotations

from typing import Annotated

import pytest

from controlplane.realtime.snapshot import (
    INSTANCE_MERGE,
    INSTANCE_RULES,
    WINDOW_MERGE,
    merge_cluster,
    rules_of,
)
from engine_interface import load_cv
from router_worker.contract.telemetry import (
    HotspotPayload,
    InstanceSnapshot,
    Merge,
    WindowStats,
)

from .helpers import hotspot_payload, instance, snapshot, window


def test_router_local_counts_and_their_maxima_are_summed() -> None:
    a = snapshot("c", "r1", [instance("i0", pending=100, pending_max=900, in_flight=2)])
    b = snapshot("c", "r2", [instance("i0", pending=50, pending_max=60, in_flight=1)])
    merged = merge_cluster("c", [a, b])
    (i0,) = merged["instances"]
    assert (i0["pending_prefill_tokens"], i0["pending_prefill_tokens_max"], i0["in_flight"]) == (
        150,
        960,
        3,
    )


def test_a_spike_seen_by_one_router_survives() -> None:
    quiet = snapshot("c", "r1", [instance("i0", pending=0, pending_max=0)])
    spiky = snapshot("c", "r2", [instance("i0", pending=0, pending_max=5000)])
    assert merge_cluster("c", [quiet, spiky])["instances"][0]["pending_prefill_tokens_max"] == 5000


def test_scrape_corrected_and_engine_values_take_the_maximum() -> None:
    a = snapshot("c", "r1", [instance("i0", batch=8, batch_max=9, kv_usage=0.5, waiting=2)])
    b = snapshot("c", "r2", [instance("i0", batch=6, batch_max=12, kv_usage=0.7, waiting=None)])
    i0 = merge_cluster("c", [a, b])["instances"][0]
    assert (i0["batch_size"], i0["batch_size_max"], i0["kv_usage"], i0["waiting"]) == (
        8,
        12,
        0.7,
        2,
    )


def test_worst_health_and_any_hotspot_win() -> None:
    a = snapshot("c", "r1", [instance("i0", health="healthy", hotspot=True)])
    b = snapshot("c", "r2", [instance("i0", health="down")])
    i0 = merge_cluster("c", [a, b])["instances"][0]
    assert (i0["health"], i0["hotspot"]) == ("down", True)


def test_instances_seen_by_one_router_only_are_kept_and_sorted() -> None:
    a = snapshot("c", "r1", [instance("i2"), instance("i0")])
    b = snapshot("c", "r2", [instance("i1")])
    assert [i["name"] for i in merge_cluster("c", [a, b])["instances"]] == ["i0", "i1", "i2"]


def test_window_counts_sum_p50_weighted_and_p99_worst() -> None:
    a = snapshot(
        "c", "r1", [], window=window(30, ttft_p50_s=0.1, ttft_p99_s=0.5, output_tokens_per_s=100)
    )
    b = snapshot(
        "c", "r2", [], window=window(10, ttft_p50_s=0.5, ttft_p99_s=0.9, output_tokens_per_s=50)
    )
    merged = merge_cluster("c", [a, b])["window"]
    assert merged["requests"] == 40
    assert merged["output_tokens_per_s"] == 150
    assert merged["ttft_p50_s"] == pytest.approx((0.1 * 30 + 0.5 * 10) / 40)
    assert merged["ttft_p99_s"] == 0.9
    assert merged["tpot_p50_s"] is None


def test_load_cv_is_recomputed_over_merged_pending_tokens() -> None:
    a = snapshot("c", "r1", [instance("i0", pending=100), instance("i1", pending=0)])
    b = snapshot("c", "r2", [instance("i1", pending=100)])
    assert merge_cluster("c", [a, b])["window"]["load_cv"] == pytest.approx(0.0)
    assert load_cv([300, 100]) == pytest.approx(0.5)


def test_load_cv_counts_only_healthy_instances_as_the_router_does() -> None:
    a = snapshot(
        "c",
        "r1",
        [
            instance("i0", pending=100),
            instance("i1", pending=100),
            instance("i2", health="draining", pending=1000),
        ],
    )
    assert merge_cluster("c", [a])["window"]["load_cv"] == pytest.approx(0.0)


def test_arms_merge_per_arm() -> None:
    a = snapshot("c", "r1", [], arms={"baseline": window(4), "candidate": window(2)})
    b = snapshot("c", "r2", [], arms={"baseline": window(6)})
    arms = merge_cluster("c", [a, b])["arms"]
    assert (arms["baseline"]["requests"], arms["candidate"]["requests"]) == (10, 2)


def test_hotspots_deduplicated_per_class_keeping_the_most_skewed() -> None:
    mild = HotspotPayload(**{**hotspot_payload(), "x": 2.0})
    strong = HotspotPayload(**{**hotspot_payload(), "x": 6.0})
    merged = merge_cluster(
        "c", [snapshot("c", "r1", [], hotspots=[mild]), snapshot("c", "r2", [], hotspots=[strong])]
    )
    assert [h["x"] for h in merged["hotspots"]] == [6.0]


def test_routers_listed_with_versions_and_newest_timestamp() -> None:
    merged = merge_cluster(
        "c",
        [snapshot("c", "r2", [], ts=20.0, version=4), snapshot("c", "r1", [], ts=10.0, version=3)],
        cluster_id=7,
    )
    assert [(r["router"], r["config_version"]) for r in merged["routers"]] == [("r1", 3), ("r2", 4)]
    assert (merged["ts"], merged["cluster_id"], merged["type"]) == (20.0, 7, "snapshot")


def test_no_router_gives_an_empty_snapshot() -> None:
    merged = merge_cluster("c", [])
    assert merged["ts"] is None and merged["instances"] == [] and merged["routers"] == []


def test_tier_traffic_is_summed_over_instances_and_absent_without_a_tier() -> None:
    a = snapshot(
        "c",
        "r1",
        [
            instance("i0", tier_hit_tokens=96, tier_bytes_read=1000),
            instance("i1", tier_hit_tokens=0, tier_bytes_read=0),
        ],
    )
    b = snapshot("c", "r2", [instance("i0", tier_hit_tokens=160, tier_bytes_read=2000)])
    merged = merge_cluster("c", [a, b])
    # the same engine's counters seen by two routers: the newer (larger) one, not the sum
    assert merged["instances"][0]["tier_hit_tokens"] == 160
    assert merged["tier"] == {"hit_tokens": 160, "bytes_read": 2000}
    plain = snapshot("c", "r1", [instance("i0"), instance("i1")])
    assert merge_cluster("c", [plain])["tier"] is None


def test_the_arm_is_the_newest_configs_whichever_router_sorts_first() -> None:
    """A router still on the old config (r1, v3) must not keep its arm on the page over the
    router on the new one (r2, v4): the first router's value used to win."""
    old = snapshot("c", "r1", [instance("i0", arm="baseline")], version=3)
    new = snapshot("c", "r2", [instance("i0", arm="candidate")], version=4)
    assert merge_cluster("c", [old, new])["instances"][0]["arm"] == "candidate"
    out = snapshot("c", "r2", [instance("i0", arm=None)], version=4)  # in neither arm now
    assert merge_cluster("c", [old, out])["instances"][0]["arm"] is None


def test_a_missing_value_never_wins_and_none_is_left_only_when_all_miss() -> None:
    unscraped = snapshot("c", "r1", [instance("i0", waiting=None, kv_usage=None, hit_ratio=0.2)])
    scraped = snapshot("c", "r2", [instance("i0", waiting=3, kv_usage=0.4, hit_ratio=None)])
    i0 = merge_cluster("c", [unscraped, scraped])["instances"][0]
    assert (i0["waiting"], i0["kv_usage"], i0["hit_ratio"], i0["running"]) == (3, 0.4, 0.2, None)


def test_an_engines_preemptions_merge_to_the_newest_count() -> None:
    """A counter since the engine's start, seen by several routers scraping at different
    moments: the largest is the newest; a router with no scrape yet does not count."""
    early = snapshot("c", "r1", [instance("i0", preemptions=12.0)])
    late = snapshot("c", "r2", [instance("i0", preemptions=15.0)])
    unscraped = snapshot("c", "r3", [instance("i0", preemptions=None)])
    merged = merge_cluster("c", [early, unscraped, late])["instances"][0]
    assert merged["preemptions"] == 15.0


def test_one_routers_silent_fallback_alarm_raises_the_instances() -> None:
    """Each router judges its own requests' predictions: one that sees its predicted hits
    unconfirmed is enough (its tokenizer may be the only wrong one)."""
    quiet = snapshot("c", "r1", [instance("i0", silent_fallback=False)])
    alarmed = snapshot("c", "r2", [instance("i0", silent_fallback=True)])
    unjudged = snapshot("c", "r3", [instance("i0", silent_fallback=None)])
    assert merge_cluster("c", [quiet, alarmed, unjudged])["instances"][0]["silent_fallback"]
    assert not merge_cluster("c", [quiet, unjudged])["instances"][0]["silent_fallback"]


def test_every_field_of_the_telemetry_records_declares_a_merge_rule() -> None:
    assert set(INSTANCE_MERGE) == set(InstanceSnapshot.model_fields)
    assert set(WINDOW_MERGE) == set(WindowStats.model_fields)
    merged = merge_cluster("c", [snapshot("c", "r1", [instance("i0")])])
    assert set(merged["instances"][0]) == set(InstanceSnapshot.model_fields)
    assert set(merged["window"]) == set(WindowStats.model_fields)

    class Newer(InstanceSnapshot):  # a field added to the contract, its rule forgotten
        prefix_cache_hits: float | None = None

    with pytest.raises(TypeError, match=r"Newer.prefix_cache_hits declares no merge rule"):
        rules_of(Newer, INSTANCE_RULES)

    class Misplaced(InstanceSnapshot):  # a window's rule on an instance's field
        spread: Annotated[float | None, Merge.WORST] = None

    with pytest.raises(TypeError, match=r"Misplaced.spread declares no merge rule"):
        rules_of(Misplaced, INSTANCE_RULES)
