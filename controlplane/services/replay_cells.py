"""The cells of a replay job: one policy at one load (rate scale) and one seed each, run as
one Celery task apiece by any ``replays`` worker (controlplane/tasks/replay.py), and the
job's results once every cell has ended.

A cell is claimed atomically (queued → running), so a cell delivered twice runs once. A
cell that fails is retried by its task where a retry can help, and otherwise ends failed
with its reason: the job still gets every other cell's results. The job ends when its last
cell does (:func:`finish_job`, run by the chord's join and by :func:`fail_abandoned`, and
a no-op once the job has ended): succeeded when at least one cell succeeded.

Results per policy and load: the mean over its seeds of each number of the simulator's
summary, the 95% confidence half-width (Student's t) of the headline ones when two or
more seeds succeeded, and the mean TTFT percentile curve.
"""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import timedelta
from typing import Any

import numpy as np
from django.db import transaction
from django.db.models import Avg, F, Q
from django.utils import timezone

from controlplane.models import ReplayCell, ReplayJob
from controlplane.selectors import captures as capture_reads
from enginesim.stats import CONFIDENCE, mean_ci

CI_KEYS = (
    "goodput_rps",
    "slo_attainment",
    "ttft_mean_s",
    "ttft_p99_s",
    "tpot_mean_s",
    "tpot_p99_s",
    "throughput_tok_s",
)
TERMINAL = (ReplayJob.State.SUCCEEDED, ReplayJob.State.FAILED)


def create_cells(job: ReplayJob) -> list[ReplayCell]:
    """A cell per policy, load and seed (a job asked for before jobs had several loads and
    seeds names one of each as ``rate_scale`` and ``seed``)."""
    inputs = job.inputs
    combos = [
        (policy, scale, seed)
        for policy in range(len(inputs.get("policies") or []))
        for scale in inputs.get("rate_scales") or [inputs.get("rate_scale") or 1.0]
        for seed in inputs.get("seeds") or [inputs.get("seed") or 0]
    ]
    return ReplayCell.objects.bulk_create(
        ReplayCell(job=job, index=index, policy=policy, rate_scale=scale, seed=seed)
        for index, (policy, scale, seed) in enumerate(combos)
    )


def cells_of(job: ReplayJob) -> list[int]:
    """The job's cell ids, made first if it has none yet."""
    with transaction.atomic():
        ReplayJob.objects.select_for_update().filter(pk=job.pk).first()
        if not job.cells.exists():
            create_cells(job)
    return list(job.cells.values_list("pk", flat=True))


def claim_cell(cell_id: int, worker: str) -> ReplayCell | None:
    """Move a queued cell to running (and its job, the first time); None when it is
    unknown or already taken."""
    now = timezone.now()
    with transaction.atomic():
        claimed = ReplayCell.objects.filter(pk=cell_id, state=ReplayCell.State.QUEUED).update(
            state=ReplayCell.State.RUNNING,
            progress=0.0,
            heartbeat_at=now,
            worker=worker[:200],
            attempts=F("attempts") + 1,
        )
        if not claimed:
            return None
        cell = ReplayCell.objects.select_related("job__cluster").get(pk=cell_id)
        ReplayJob.objects.filter(pk=cell.job_id, state=ReplayJob.State.QUEUED).update(
            state=ReplayJob.State.RUNNING, heartbeat_at=now
        )
    return cell


def record_progress(cell_id: int, fraction: float) -> None:
    now = timezone.now()
    fraction = min(max(fraction, 0.0), 0.99)
    ReplayCell.objects.filter(pk=cell_id, state=ReplayCell.State.RUNNING).update(
        progress=fraction, heartbeat_at=now
    )
    job_id = ReplayCell.objects.filter(pk=cell_id).values_list("job_id", flat=True).first()
    if job_id is not None:
        _update_job_progress(job_id, now)


def heartbeat(cell_id: int) -> None:
    """The cell's worker is alive (a cell loading a large trace, or simulating long, says
    so between its progress reports): its and its job's heartbeat, nothing else."""
    now = timezone.now()
    ReplayCell.objects.filter(pk=cell_id, state=ReplayCell.State.RUNNING).update(heartbeat_at=now)
    job_id = ReplayCell.objects.filter(pk=cell_id).values_list("job_id", flat=True).first()
    if job_id is not None:
        ReplayJob.objects.filter(pk=job_id, state=ReplayJob.State.RUNNING).update(heartbeat_at=now)


def _update_job_progress(job_id: int, now: Any) -> None:
    mean = ReplayCell.objects.filter(job_id=job_id).aggregate(p=Avg("progress"))["p"] or 0.0
    ReplayJob.objects.filter(pk=job_id, state=ReplayJob.State.RUNNING).update(
        progress=min(mean, 0.99), heartbeat_at=now
    )


def requeue(cell_id: int) -> None:
    """Back to queued, for its task's retry to claim it again."""
    ReplayCell.objects.filter(pk=cell_id, state=ReplayCell.State.RUNNING).update(
        state=ReplayCell.State.QUEUED, progress=0.0
    )


def finish_cell(cell_id: int, *, result: dict[str, Any] | None = None, error: str = "") -> str:
    state = ReplayCell.State.FAILED if error else ReplayCell.State.SUCCEEDED
    now = timezone.now()
    ReplayCell.objects.filter(pk=cell_id, state=ReplayCell.State.RUNNING).update(
        state=state,
        result=result,
        error=error,
        progress=1.0,
        finished_at=now,
        heartbeat_at=now,
    )
    job_id = ReplayCell.objects.filter(pk=cell_id).values_list("job_id", flat=True).first()
    if job_id is not None:
        _update_job_progress(job_id, now)
    return state


@transaction.atomic
def finish_job(job_id: int) -> str | None:
    """End the job from its cells once none is queued or running; its state then, or
    None while cells are still to run (or it is unknown). Whatever combining the cells'
    results raises (a cell stored nonsense, a value the database refuses), the job ends:
    failed, with the reason."""
    job = ReplayJob.objects.select_for_update().filter(pk=job_id).first()
    if job is None:
        return None
    if job.state in TERMINAL:
        return job.state
    cells = list(job.cells.all())
    if not cells or not all(cell.terminal for cell in cells):
        return None
    succeeded = [cell for cell in cells if cell.state == ReplayCell.State.SUCCEEDED]
    failed = [cell for cell in cells if cell.state == ReplayCell.State.FAILED]
    error = "" if succeeded else _failure_summary(failed)
    try:
        with transaction.atomic():  # a savepoint: a database error here undoes only this
            job.results = aggregate(job.inputs, cells) if succeeded else None
            if job.results is not None:
                job.results["fidelity"] = fidelity(job.inputs, job.results)
            _end(job, error)
    except Exception as problem:  # anything: the job must end
        job.results = None
        _end(job, f"the cells' results could not be combined: {type(problem).__name__}: {problem}")
    return job.state


def _end(job: ReplayJob, error: str) -> None:
    job.state = ReplayJob.State.FAILED if error else ReplayJob.State.SUCCEEDED
    job.error = error[:2000]
    job.progress = 0.0 if error else 1.0
    job.finished_at = timezone.now()
    job.save(update_fields=["results", "state", "error", "progress", "finished_at"])


def fail_job(job_id: int, reason: str) -> str | None:
    """End a job that could not be finished otherwise: failed, with ``reason``."""
    ReplayJob.objects.filter(pk=job_id).exclude(state__in=TERMINAL).update(
        state=ReplayJob.State.FAILED,
        error=reason[:2000],
        progress=0.0,
        finished_at=timezone.now(),
    )
    return ReplayJob.objects.filter(pk=job_id).values_list("state", flat=True).first()


def finish_settled() -> int:
    """End every running job whose cells have all ended (each cell's task ends its job;
    this catches one whose ending failed). The count of jobs ended."""
    running = ReplayJob.objects.filter(state=ReplayJob.State.RUNNING)
    settled = (
        running.exclude(cells__state__in=[ReplayCell.State.QUEUED, ReplayCell.State.RUNNING])
        .filter(cells__isnull=False)
        .distinct()
    )
    return sum(finish_job(pk) in TERMINAL for pk in settled.values_list("pk", flat=True))


def _failure_summary(failed: list[ReplayCell]) -> str:
    reasons = sorted({cell.error for cell in failed})
    return "; ".join(reasons)[:2000]


def fail_abandoned(older_than_s: float) -> int:
    """Fail running cells whose worker has been silent for ``older_than_s`` (a worker that
    dies takes its task with it, and a cell that killed one worker would kill the next, so
    it is not delivered again), then end their jobs. Running jobs without cells (requested
    before jobs had them) are failed as they were. The count of cells and jobs failed."""
    cutoff = timezone.now() - timedelta(seconds=older_than_s)
    silent = Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True)
    abandoned = ReplayCell.objects.filter(silent, state=ReplayCell.State.RUNNING)
    jobs = set(abandoned.values_list("job_id", flat=True))
    count = abandoned.update(
        state=ReplayCell.State.FAILED,
        error="the worker running this cell stopped before it finished (killed, restarted "
        "or out of memory)",
        finished_at=timezone.now(),
    )
    for job_id in jobs:
        finish_job(job_id)
    return count


# ----------------------------------------------------------------- results


def fidelity(inputs: dict[str, Any], results: dict[str, Any]) -> dict[str, Any] | None:
    """For a replay of captured traffic: one replayed policy at the captured rate (rate
    scale 1) beside what the routers measured live for the requests it served (those routed
    under it on the whole cluster, by their config versions: the job's ``fidelity``
    selection, services/replays.py), on the same requests of the replay, so the operator
    knows how far to trust the other rows. None for other traces, or when that policy was
    not replayed at rate scale 1. A job asked for before selections (or of a capture whose
    requests carry no config version) compares the active policy on every request."""
    trace, ids = str(inputs.get("trace", "")), inputs.get("policy_ids") or []
    if not trace.startswith("capture:"):
        return None
    selection = inputs.get("fidelity")
    if selection is None:  # a job from before selections: the active policy, every request
        active = inputs.get("active_policy_id")
        if active not in ids:
            return None
        selection = {"policy": ids.index(active), "versions": None, "name": None}
    if selection.get("policy") is None:  # no replayed policy ran the cluster alone
        return {"requests": 0, "of": selection.get("of"), "metrics": [], "policy": None}
    spec = inputs["policies"][selection["policy"]]
    row = next(
        (
            r
            for r in results["policies"]
            if r["rate_scale"] == 1.0
            and r["kind"] == spec["kind"]
            and r["params"] == spec.get("params", {})
        ),
        None,
    )
    versions = selection.get("versions")
    live = capture_reads.live_latencies(
        int(trace.split(":", 1)[1]),
        inputs.get("max_requests"),
        inputs.get("capture_until"),
        versions,
    )
    if row is None or live is None:
        return None
    replayed_on = row["summary"] if versions is None else row.get("selected")
    if replayed_on is None:
        return None
    metrics = []
    for key in capture_reads.FIDELITY_METRICS:
        measured, replayed = live.get(key), replayed_on.get(key)
        ratio = None
        if measured and replayed is not None:
            ratio = (replayed - measured) / measured
        metrics.append({"metric": key, "live": measured, "replay": replayed, "diff": ratio})
    return {
        "policy": spec["kind"],
        "name": selection.get("name"),
        "active": ids[selection["policy"]] == inputs.get("active_policy_id") if ids else None,
        "versions": versions,
        "requests": live["requests"],
        "of": selection.get("of", live["requests"]),
        "measured": live["measured"],
        "metrics": metrics,
    }


def aggregate(inputs: dict[str, Any], cells: list[ReplayCell]) -> dict[str, Any]:
    """One row per policy and load, over the seeds that succeeded (see the module
    docstring); the cells that failed are listed with their reasons."""
    groups: dict[tuple[int, float], list[ReplayCell]] = defaultdict(list)
    for cell in cells:
        groups[cell.policy, cell.rate_scale].append(cell)
    rows = [
        _row(inputs["policies"][policy], scale, group)
        for (policy, scale), group in sorted(groups.items())
        if any(cell.result for cell in group)
    ]
    first = next(c for c in sorted(cells, key=lambda c: c.index) if c.result)
    assert first.result is not None
    return {
        "policies": rows,
        "failed_cells": [
            {
                "policy": cell.policy,
                "rate_scale": cell.rate_scale,
                "seed": cell.seed,
                "error": cell.error,
            }
            for cell in cells
            if cell.state == ReplayCell.State.FAILED
        ],
        "rate_scales": sorted({cell.rate_scale for cell in cells}),
        "seeds": sorted({cell.seed for cell in cells}),
        "instances": first.result["instances"],
        "requests": first.result["requests"],
        "percentiles": first.result["percentiles"],
        "lower_bound": first.result["lower_bound"],
    }


def _row(spec: dict[str, Any], scale: float, group: list[ReplayCell]) -> dict[str, Any]:
    results = [cell.result for cell in group if cell.result is not None]
    summaries = [result["summary"] for result in results]
    curves = [r["ttft_percentiles"] for r in results if r.get("ttft_percentiles")]
    selected = [r["selected"] for r in results if r.get("selected")]
    row = {
        "kind": spec["kind"],
        "params": spec.get("params", {}),
        "rate_scale": scale,
        "seeds": len(results),
        "summary": _means(summaries),
        "ci": {key: _half_width([s.get(key) for s in summaries]) for key in CI_KEYS},
        "ttft_percentiles": np.mean(curves, axis=0).tolist() if curves else None,
    }
    if selected and len(selected) == len(results):  # the requests held against live ones
        row["selected"] = _means(selected)
    tenants = _tenant_means([r["tenants"] for r in results if r.get("tenants")])
    if tenants:  # flow control ran: each tenant's outcome
        row["tenants"] = tenants
    return row


def _tenant_means(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    """Each tenant's row, its numbers the mean over the seeds it appears in."""
    names = sorted({name for tenants in per_seed for name in tenants})
    return {name: _means([t[name] for t in per_seed if name in t]) for name in names}


def _means(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """The mean of each number over the seeds (None where a seed has none), of a nested
    summary's numbers alike (a disaggregated cluster's split counts); anything else as the
    first seed has it."""
    if not summaries:
        return {}
    out: dict[str, Any] = {}
    for key, value in summaries[0].items():
        values = [s.get(key) for s in summaries]
        numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
        if len(numbers) == len(values):
            out[key] = float(np.mean(numbers))
        elif all(isinstance(v, dict) for v in values):
            out[key] = _means([v for v in values if isinstance(v, dict)])
        else:
            out[key] = value
    return out


def _half_width(values: list[Any]) -> float | None:
    numbers = [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    if len(numbers) < 2 or len(numbers) != len(values):
        return None
    half = mean_ci(numbers, CONFIDENCE).half_width
    return half if math.isfinite(half) else None
