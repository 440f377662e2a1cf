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
``disaggregation`` (None unless some router reports its cluster disaggregated) sums the
routers' decider counts (split ratio of their recent decisions) and aggregates the merged
instances into the prefill and decode pools by role (``pool_totals``).

Window statistics: counts and rates are summed; p50s are averaged weighted by requests;
p99s take the worst router (a conservative bound, percentiles do not merge exactly). Load
CV is recomputed over the merged pending prefill tokens of the healthy instances, with
the routers' own definition (``engine_interface.load_cv``).

The rules are declared on each field of the contract's records
(``router_worker.contract.telemetry``: ``Annotated[type, Merge.X]``), and every field must
declare one this module applies (``INSTANCE_MERGE``, ``WINDOW_MERGE`` are built from them):
a field added to the contract without a rule stops this module's import, naming the field,
instead of silently keeping one router's value. A missing value (None: the router has no scrape yet,
the engine reports no tier) never wins: it is skipped, and the merged value is None only
when no router has one. ``arm`` is a fact of the configuration, so it is the value of the
router on the newest config version (then the newest snapshot), whatever the others say.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from pydantic import BaseModel

from engine_interface import load_cv
from router_worker.contract.telemetry import (
    ClassLane,
    DisaggregationStats,
    HotspotPayload,
    InstanceSnapshot,
    Merge,
    StateSnapshot,
    TenantLane,
    WindowStats,
    merge_rule,
)
from router_worker.routing.flow import PRIORITIES

HEALTH_ORDER = ("healthy", "draining", "down")


def _present(values: list[Any]) -> list[Any]:
    return [v for v in values if v is not None]


def _same(values: list[Any]) -> Any:
    return values[0]


def _total(values: list[Any]) -> Any:
    present = _present(values)
    return sum(present) if present else None


def _largest(values: list[Any]) -> Any:
    present = _present(values)
    return max(present) if present else None


def _worst_health(values: list[Any]) -> Any:
    present = _present(values)
    return max(present, key=HEALTH_ORDER.index) if present else None


def _any(values: list[Any]) -> bool:
    return any(_present(values))


def _newest_config(values: list[Any]) -> Any:
    return values[-1]  # the reports come oldest config first


# What each rule a field of InstanceSnapshot declares (router_worker.contract.telemetry's
# Merge) does with the field's values, one per router, ordered oldest config first.
INSTANCE_RULES: dict[Merge, Callable[[list[Any]], Any]] = {
    Merge.SAME: _same,
    Merge.WORST_HEALTH: _worst_health,
    Merge.TOTAL: _total,
    Merge.LARGEST: _largest,
    Merge.ANY: _any,
    Merge.NEWEST_CONFIG: _newest_config,
}


def rules_of(record: type[BaseModel], rules: dict[Merge, Any]) -> dict[str, Any]:
    """Per field of ``record``, the function of the merge rule it declares; a field that
    declares none, or one this merge cannot apply, stops the import, naming it."""
    table: dict[str, Any] = {}
    for name in record.model_fields:
        rule = merge_rule(record, name)
        if rule not in rules:
            raise TypeError(
                f"{record.__name__}.{name} declares no merge rule this module applies "
                f"({rule}): declare one of {sorted(rules)} on the field "
                "(router_worker/contract/telemetry.py)"
            )
        table[name] = rules[rule]
    return table


INSTANCE_MERGE = rules_of(InstanceSnapshot, INSTANCE_RULES)


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
        "tenants": merge_tenants(routers),
        "disaggregation": merge_disaggregation(routers, instances),
    }


def tier_totals(instances: list[dict[str, Any]]) -> dict[str, float | None] | None:
    """Global-tier traffic summed over the instances; None if none reports a tier."""
    totals: dict[str, float | None] = {}
    for key, field in (("hit_tokens", "tier_hit_tokens"), ("bytes_read", "tier_bytes_read")):
        values = [i[field] for i in instances if i.get(field) is not None]
        totals[key] = sum(values) if values else None
    return None if totals["hit_tokens"] is None and totals["bytes_read"] is None else totals


DISAGG_MERGE = rules_of(DisaggregationStats, {Merge.TOTAL: _total})
PREFILL_ROLES, DECODE_ROLES = ("prefill", "both"), ("decode", "both")


def merge_disaggregation(
    snapshots: list[StateSnapshot], instances: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """A disaggregated cluster's two pools and its decider (None when no router reports
    the cluster disaggregated): the routers' counts summed, the split ratio of their recent
    decisions, the pools aggregated over the merged instances (`pool_totals`) and the KV
    reads that failed on any instance since the engines started."""
    reports = [s.disaggregation for s in snapshots if s.disaggregation is not None]
    if not reports:
        return None
    merged = {
        field: rule([getattr(r, field) for r in reports]) for field, rule in DISAGG_MERGE.items()
    }
    merged["split_ratio"] = merged["recent_split"] / merged["recent"] if merged["recent"] else None
    failed = _present([i.get("kv_failed_transfers") for i in instances])
    merged["transfer_failures"] = sum(failed) if failed else None
    merged["pools"] = pool_totals(instances)
    return merged


def _mean(values: list[Any]) -> float | None:
    present = _present(values)
    return sum(present) / len(present) if present else None


def _sum_or_none(values: list[Any]) -> float | None:
    present = _present(values)
    return float(sum(present)) if present else None


def pool_totals(instances: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The prefill pool (instances of role prefill or both: their pending prefill tokens
    summed, the engines' prefix-cache hit ratio averaged) and the decode pool (role decode
    or both: batch sizes summed, KV usage averaged, KV reads in flight and bytes read per
    second summed, failed reads summed). Down instances are counted apart and left out of
    the load; an instance of role both is in both pools, as the router places it."""
    pools: dict[str, dict[str, Any]] = {}
    for pool, roles in (("prefill", PREFILL_ROLES), ("decode", DECODE_ROLES)):
        members = [i for i in instances if (i.get("role") or "both") in roles]
        up = [i for i in members if i["health"] != "down"]
        pools[pool] = {
            "instances": len(members),
            "up": len(up),
            "pending_prefill_tokens": float(sum(i["pending_prefill_tokens"] for i in up)),
            "hit_ratio": _mean([i.get("hit_ratio") for i in up]),
            "batch_size": float(sum(i["batch_size"] for i in up)),
            "kv_usage": _mean([i.get("kv_usage") for i in up]),
            "kv_transfers_in_flight": _sum_or_none([i.get("kv_transfers_in_flight") for i in up]),
            "kv_bytes_per_s": _sum_or_none([i.get("kv_bytes_per_s") for i in up]),
            "kv_failed_transfers": _sum_or_none([i.get("kv_failed_transfers") for i in members]),
        }
    return pools


def router_summary(snapshot: StateSnapshot) -> dict[str, Any]:
    return {
        "router": snapshot.router,
        "ts": snapshot.ts,
        "policy": snapshot.policy,
        "config_version": snapshot.config_version,
    }


def merge_instances(snapshots: list[StateSnapshot]) -> list[dict[str, Any]]:
    """Each instance any router reports, merged field by field (``INSTANCE_MERGE``)."""
    oldest_first = sorted(
        snapshots, key=lambda s: (-1 if s.config_version is None else s.config_version, s.ts)
    )
    reports: dict[str, list[InstanceSnapshot]] = {}
    for snapshot in oldest_first:
        for instance in snapshot.instances:
            reports.setdefault(instance.name, []).append(instance)
    return [
        {
            field: rule([getattr(r, field) for r in reports[name]])
            for field, rule in INSTANCE_MERGE.items()
        }
        for name in sorted(reports)
    ]


def merge_windows(windows: list[WindowStats]) -> dict[str, Any]:
    """The routers' window statistics merged field by field (``WINDOW_MERGE``)."""
    return {field: rule(windows, field) for field, rule in WINDOW_MERGE.items()}


def _sum_field(windows: list[WindowStats], field: str) -> float:
    return sum(getattr(w, field) for w in windows)


def _longest(windows: list[WindowStats], field: str) -> float:
    return max((getattr(w, field) for w in windows), default=0.0)


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


# What each rule a field of WindowStats declares does with the windows and the field.
# load_cv is recomputed for the cluster over merged instances.
WINDOW_RULES: dict[Merge, Callable[[list[WindowStats], str], Any]] = {
    Merge.LONGEST: _longest,
    Merge.TOTAL: _sum_field,
    Merge.WEIGHTED_MEAN: _weighted_mean,  # weighted by requests
    Merge.WORST: _max_field,
}
WINDOW_MERGE = rules_of(WindowStats, WINDOW_RULES)


def merge_arms(snapshots: list[StateSnapshot]) -> dict[str, dict[str, Any]]:
    by_arm: dict[str, list[WindowStats]] = {}
    for snapshot in snapshots:
        for arm, stats in snapshot.arms.items():
            by_arm.setdefault(arm, []).append(stats)
    return {arm: merge_windows(stats) for arm, stats in sorted(by_arm.items())}


def _newest(lanes: list[Any], field: str) -> Any:
    return getattr(lanes[-1], field)  # the reports come oldest config first


# What each rule a field of ClassLane declares does with the class lanes and the field.
CLASS_RULES: dict[Merge, Callable[[list[Any], str], Any]] = {
    Merge.TOTAL: _sum_field,
    Merge.WEIGHTED_MEAN: _weighted_mean,  # weighted by requests
}
CLASS_MERGE = rules_of(ClassLane, CLASS_RULES)


def _by_class(lanes: list[Any], field: str) -> dict[str, dict[str, Any]]:
    """A tenant's per-class lanes over the routers, class by class."""
    by_class: dict[str, list[ClassLane]] = {}
    for lane in lanes:
        for name, classed in getattr(lane, field).items():
            by_class.setdefault(name, []).append(classed)
    return {
        name: {f: rule(classed, f) for f, rule in CLASS_MERGE.items()}
        for name, classed in sorted(by_class.items(), key=lambda item: _class_rank(item[0]))
    }


def _class_rank(name: str) -> tuple[int, str]:
    return (PRIORITIES.index(name), name) if name in PRIORITIES else (len(PRIORITIES), name)


# What each rule a field of TenantLane declares does with the lanes and the field.
TENANT_RULES: dict[Merge, Callable[[list[Any], str], Any]] = {
    Merge.NEWEST_CONFIG: _newest,
    Merge.TOTAL: _sum_field,
    Merge.WEIGHTED_MEAN: _weighted_mean,  # weighted by requests
    Merge.BY_KEY: _by_class,
}
TENANT_MERGE = rules_of(TenantLane, TENANT_RULES)


def merge_tenants(snapshots: list[StateSnapshot]) -> dict[str, dict[str, Any]]:
    """Each tenant's lane over the routers, with its share of the tokens served."""
    by_tenant: dict[str, list[TenantLane]] = {}
    for snapshot in sorted(snapshots, key=lambda s: s.config_version or 0):
        for tenant, lane in snapshot.tenants.items():
            by_tenant.setdefault(tenant, []).append(lane)
    merged = {
        tenant: {field: rule(lanes, field) for field, rule in TENANT_MERGE.items()}
        for tenant, lanes in sorted(by_tenant.items())
    }
    served = sum(row["served_tokens"] for row in merged.values())
    weights = sum(row["weight"] for row in merged.values())
    for row in merged.values():
        row["share"] = row["served_tokens"] / served if served else None
        row["weight_share"] = row["weight"] / weights if weights else None
    return merged


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
