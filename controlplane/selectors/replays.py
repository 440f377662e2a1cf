from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from controlplane.models import ReplayJob

from .common import get_or_404


def replays(cluster_id: int | None = None, state: str | None = None) -> QuerySet[ReplayJob]:
    queryset = ReplayJob.objects.select_related("created_by").order_by("-created_at", "-id")
    if cluster_id is not None:
        queryset = queryset.filter(cluster_id=cluster_id)
    return queryset.filter(state=state) if state else queryset


def replay(replay_id: int) -> ReplayJob:
    return get_or_404(replays(), replay_id, "replay")


def canary_ids(job: ReplayJob) -> list[int]:
    """The canaries started from the job's recommendation, newest first."""
    return list(job.canaries.order_by("-created_at", "-id").values_list("pk", flat=True))


def cells(job: ReplayJob) -> list[dict[str, Any]]:
    """The job's cells for its page: each with its policy's kind."""
    policies = job.inputs.get("policies") or []
    rows = []
    for cell in job.cells.order_by("index"):
        spec = policies[cell.policy] if cell.policy < len(policies) else {}
        rows.append({"cell": cell, "kind": spec.get("kind", f"policy {cell.policy}")})
    return rows


def recommendation(job: ReplayJob) -> dict[str, Any] | None:
    """What the job's results say about the policy the cluster ran when it was asked for.

    The policy to recommend beats the active one on goodput by more than the noise (the
    two 95% half-widths combined) at one load at least, and is nowhere worse by more than
    the noise; of several, the one with the largest mean relative gain. None when the job
    cannot say (no results, or the active policy was not among those replayed); otherwise
    ``{"active", "candidate" (None: keep the active one), "loads": [...], "why"}``.
    """
    results, inputs = job.results or {}, job.inputs
    ids, active = inputs.get("policy_ids"), inputs.get("active_policy_id")
    if not results.get("policies") or not ids or active not in ids:
        return None
    by_policy: dict[int, dict[float, dict[str, Any]]] = {}
    for row in results["policies"]:
        index = _row_policy(row, inputs)
        if index is not None:
            by_policy.setdefault(ids[index], {})[row["rate_scale"]] = row
    baseline = by_policy.get(active, {})
    if any(row.get("ci", {}).get("goodput_rps") is None for row in baseline.values()):
        return {"active": active, "candidate": None, "loads": [], "why": "noise"}
    best: tuple[float, int, list[dict[str, Any]]] | None = None
    for policy_id, rows in by_policy.items():
        if policy_id == active or set(rows) != set(baseline):
            continue
        loads = [_compare(baseline[scale], rows[scale], scale) for scale in sorted(rows)]
        if any(load["noise"] is None for load in loads):
            continue
        wins = any(load["diff"] > load["noise"] for load in loads)
        never_worse = all(load["diff"] >= -load["noise"] for load in loads)
        gain = float(sum(load["relative"] for load in loads) / len(loads))
        if wins and never_worse and (best is None or gain > best[0]):
            best = (gain, policy_id, loads)
    if best is None:
        return {"active": active, "candidate": None, "loads": [], "why": "no winner"}
    return {"active": active, "candidate": best[1], "loads": best[2], "why": "wins"}


def _row_policy(row: dict[str, Any], inputs: dict[str, Any]) -> int | None:
    """The index in the job's policies of a results row (kind and params identify it)."""
    for index, spec in enumerate(inputs.get("policies") or []):
        if spec.get("kind") == row.get("kind") and spec.get("params", {}) == row.get("params"):
            return index
    return None


def _compare(active: dict[str, Any], candidate: dict[str, Any], scale: float) -> dict[str, Any]:
    a, c = active["summary"]["goodput_rps"], candidate["summary"]["goodput_rps"]
    ha, hc = active["ci"].get("goodput_rps"), candidate["ci"].get("goodput_rps")
    noise = None if ha is None or hc is None else float((ha**2 + hc**2) ** 0.5)
    return {
        "rate_scale": scale,
        "active": a,
        "candidate": c,
        "diff": c - a,
        "noise": noise,
        "relative": (c - a) / a if a else 0.0,
    }
