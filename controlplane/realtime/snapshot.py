"""Merging the routers' state snapshots of one cluster into one cluster snapshot (pure).

Every router of a cluster writes its own `StateSnapshot`. Per instance, router-local
accounting is disjoint (each router counts only the requests it sent), so pending prefill
tokens and in-flight requests are summed, and so are their per-interval maxima: the sum of
maxima bounds the true maximum from above, so a spike seen by any router survives. Batch
size is scrape-corrected by each router (max(local, engine running)), so router views
overlap and the merge takes the maximum. Engine-reported values (waiting, running, KV usage,
hit ratio, global-tier counters) describe the same engine, so the merge takes the maximum
too. ``tier`` sums the instances' global-tier counters (tokens loaded from the tier, bytes
read) when any engine reports a tier, and is None otherwise (the page then hides it).

Window statistics: counts and rates are summed; p50s are averaged weighted by requests;
p99s take the worst router (a conservative bound, percentiles do not merge exactly). Load
CV is recomputed over the merged pending prefill tokens of the healthy instances, with
the routers' own definition (``engine_interface.load_cv``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from engine_interface import load_cv
from router_worker.telemetry_contract import (
    HotspotPayload,
    InstanceSnapshot,
    StateSnapshot,
    WindowStats,
)

HEALTH_ORDER = ("healthy", "draining", "down")
SUMMED_INSTANCE_FIELDS = ("pending_prefill_tokens", "pending_prefill_tokens_max", "in_flight")
MAX_INSTANCE_FIELDS = (
    "batch_size",
    "batch_size_max",
    "waiting",
    "running",
    "kv_usage",
    "hit_ratio",
    "tier_hit_tokens",
    "tier_bytes_read",
)


def merge_cluster(
    cluster: str, snapshots: Iterable[StateSnapshot], *, cluster_id: int | None = None
) -> dict[str, Any]:
    """One JSON-ready cluster snapshot from the routers' latest snapshots."""
    routers = sorted(snapshots, key=lambda s: s.router)
    instances = merge_instances(routers)
    window = merge_windows([r.window for r in routers])
    window["load_cv"] = load_cv(
        [i["pending_prefill_tokens"] for i in instances if i["health"] == "healthy"]
    )
    return {
        "type": "snapshot",
        "cluster": cluster,
        "cluster_id": cluster_id,
        "ts": max((r.ts for r in routers), default=None),
        "routers": [router_summary(r) for r in routers],
        "window": window,
        "arms": merge_arms(routers),
        "instances": instances,
        "tier": tier_totals(instances),
        "hotspots": merge_hotspots(routers),
    }


def tier_totals(instances: list[dict[str, Any]]) -> dict[str, float | None] | None:
    """Global-tier traffic summed over the instances; None if none reports a tier."""
    totals: dict[str, float | None] = {}
    for key, field in (("hit_tokens", "tier_hit_tokens"), ("bytes_read", "tier_bytes_read")):
        values = [i[field] for i in instances if i.get(field) is not None]
        totals[key] = sum(values) if values else None
    return None if totals["hit_tokens"] is None and totals["bytes_read"] is None else totals


def router_summary(snapshot: StateSnapshot) -> dict[str, Any]:
    return {
        "router": snapshot.router,
        "ts": snapshot.ts,
        "policy": snapshot.policy,
        "config_version": snapshot.config_version,
    }


def merge_instances(snapshots: list[StateSnapshot]) -> list[dict[str, Any]]:
    merged: dict[str, dict[str, Any]] = {}
    for snapshot in snapshots:
        for instance in snapshot.instances:
            current = merged.get(instance.name)
            merged[instance.name] = (
                instance.model_dump() if current is None else _merge_instance(current, instance)
            )
    return [merged[name] for name in sorted(merged)]


def _merge_instance(into: dict[str, Any], other: InstanceSnapshot) -> dict[str, Any]:
    for field in SUMMED_INSTANCE_FIELDS:
        into[field] = into[field] + getattr(other, field)
    for field in MAX_INSTANCE_FIELDS:
        into[field] = _max_optional(into[field], getattr(other, field))
    into["health"] = max(into["health"], other.health, key=HEALTH_ORDER.index)
    into["hotspot"] = into["hotspot"] or other.hotspot
    into["arm"] = into["arm"] or other.arm
    return into


def _max_optional(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else max(a, b)


def merge_windows(windows: list[WindowStats]) -> dict[str, Any]:
    requests = sum(w.requests for w in windows)
    return {
        "seconds": max((w.seconds for w in windows), default=0.0),
        "requests": requests,
        "errors": sum(w.errors for w in windows),
        "requests_per_s": sum(w.requests_per_s for w in windows),
        "output_tokens_per_s": sum(w.output_tokens_per_s for w in windows),
        "ttft_p50_s": _weighted_mean(windows, "ttft_p50_s"),
        "ttft_p99_s": _max_field(windows, "ttft_p99_s"),
        "tpot_p50_s": _weighted_mean(windows, "tpot_p50_s"),
        "tpot_p99_s": _max_field(windows, "tpot_p99_s"),
        "hit_ratio": _weighted_mean(windows, "hit_ratio"),
        "load_cv": _max_field(windows, "load_cv"),
    }


def _weighted_mean(windows: list[WindowStats], field: str) -> float | None:
    pairs = [(getattr(w, field), w.requests) for w in windows if getattr(w, field) is not None]
    if not pairs:
        return None
    weight = sum(max(n, 0) for _, n in pairs)
    if weight == 0:
        return sum(v for v, _ in pairs) / len(pairs)
    return sum(v * n for v, n in pairs) / weight


def _max_field(windows: list[WindowStats], field: str) -> float | None:
    values = [getattr(w, field) for w in windows if getattr(w, field) is not None]
    return max(values) if values else None


def merge_arms(snapshots: list[StateSnapshot]) -> dict[str, dict[str, Any]]:
    by_arm: dict[str, list[WindowStats]] = {}
    for snapshot in snapshots:
        for arm, stats in snapshot.arms.items():
            by_arm.setdefault(arm, []).append(stats)
    return {arm: merge_windows(stats) for arm, stats in sorted(by_arm.items())}


def merge_hotspots(snapshots: list[StateSnapshot]) -> list[dict[str, Any]]:
    """Currently confirmed hotspots, one per prefix class (the most lopsided report)."""
    best: dict[str, HotspotPayload] = {}
    for snapshot in snapshots:
        for hotspot in snapshot.hotspots:
            known = best.get(hotspot.prefix_class)
            if known is None or _skew(hotspot) > _skew(known):
                best[hotspot.prefix_class] = hotspot
    return [best[key].model_dump() for key in sorted(best)]


def _skew(hotspot: HotspotPayload) -> float:
    return hotspot.x / hotspot.x_bar if hotspot.x_bar else math.inf


def empty_cluster(cluster: str, cluster_id: int | None = None) -> dict[str, Any]:
    """What the page shows when no router has reported (all routers down or none yet)."""
    return merge_cluster(cluster, [], cluster_id=cluster_id)
