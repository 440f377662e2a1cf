"""The what-if replay tasks: a job's trace through enginesim's discrete-event simulator on
the cluster's model and GPU, one task per cell (a policy at a load and a seed) on the
``replays`` queue, joined by a chord whose join stores the job's results
(controlplane/services/replay_cells.py).

The adapter below is the only place that knows enginesim's replay API; the task is thin.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, cast

import numpy as np
from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded
from django.db import connection

from controlplane.models import Cluster, ReplayCell, ReplayJob
from controlplane.selectors import captures as capture_reads
from controlplane.services import config as config_service
from controlplane.services import replay_cells
from controlplane.services import replays as replay_service
from controlplane.services.errors import ServiceError
from controlplane.services.traces import check_trace
from engine_interface import percentile
from router_worker.routing.features import DEFAULT_TENANT

log = logging.getLogger(__name__)
ENGINE_UNAVAILABLE = "replay engine unavailable"
OUT_OF_MEMORY = (
    "the replay ran out of memory on its worker; choose fewer requests "
    "(max requests) or a smaller trace"
)
TIME_LIMIT = "the replay ran past its one-hour limit; choose fewer requests"
PROGRESS_EVERY_S = 0.5
HEARTBEAT_S = 15.0  # well inside replays.ABANDONED_AFTER_S (300 s)
# The simulated time a replay may span (arrivals, after the rate scale): a week's capture
# at its own rate, with a day to spare.
MAX_SIMULATED_S = 8 * 86400.0
CELL_RETRIES = 2  # an unexpected error is retried this often, then reported
RETRY_AFTER_S = 2
TTFT_PERCENTILES = list(range(1, 100))

Progress = Callable[[float], None]


class ReplayFailed(Exception):
    """A replay that cannot run; the message is shown to the operator."""


# ----------------------------------------------------------------- adapter (enginesim)


def simulator_model(cluster: Cluster) -> str:
    """enginesim's model key for the cluster's served model (key or served name, as a
    cluster's model is checked when it is created)."""
    from enginesim.replay.policy_costs import UnknownHardwareError, model_key

    try:
        return model_key(cluster.model)
    except UnknownHardwareError as error:  # a cluster stored before names were checked
        raise ReplayFailed(f"no cost model for the cluster's model: {error}") from None


def simulator_gpu(cluster: Cluster) -> str:
    from enginesim.replay.policy_costs import UnknownHardwareError, gpu_key

    try:
        return gpu_key(cluster.gpu_type)
    except UnknownHardwareError as error:
        raise ReplayFailed(f"no cost model for the cluster's GPU: {error}") from None


def run_cell(cell: ReplayCell, progress: Progress) -> dict[str, Any]:
    """Replay the job's trace for one cell: its policy, at its rate scale, with its seed."""
    try:
        from enginesim.replay.metrics import by_tenant, lower_bound_summary, summarize, ttfts
        from enginesim.replay.simulator import SimConfig, Simulator
        from enginesim.replay.traces import load_trace, scale_tenant
        from router_worker.routing.grey import GreyParams
    except ImportError as error:
        raise ReplayFailed(f"{ENGINE_UNAVAILABLE}: {error}") from None
    job, cluster = cell.job, cell.job.cluster
    inputs = job.inputs
    try:
        path = replay_service.trace_file(cluster.pk, inputs)
    except ServiceError as error:
        raise ReplayFailed(error.message) from None
    check_trace(path, cluster.model)  # again: the file or the cluster's model may have changed
    records = load_trace(path, rate_scale=cell.rate_scale, max_requests=inputs.get("max_requests"))
    if not records:
        raise ReplayFailed("the trace selection holds no request")
    span = max(r.arrival_s for r in records) - min(r.arrival_s for r in records)
    if span > MAX_SIMULATED_S:
        raise ReplayFailed(
            f"at rate scale {cell.rate_scale:g} the trace spans {span:.3g} simulated seconds, "
            f"more than a replay simulates ({MAX_SIMULATED_S:.0f} s, 8 days); choose a higher "
            "rate scale or fewer requests"
        )
    roles = _replay_roles(cluster)
    instances = max(len(roles), 1)
    tenants, names = _replay_tenants(cluster, inputs["trace"])
    for tenant, factor in sorted((inputs.get("tenant_scales") or {}).items()):
        records = scale_tenant(records, names.get(tenant, tenant), factor, cell.seed)
    mode = inputs.get("flow") or "cluster"
    spec = inputs["policies"][cell.policy]
    config = SimConfig(
        instances=instances,
        gpu=simulator_gpu(cluster),
        model=simulator_model(cluster),
        seed=cell.seed,
        policy_params={spec["kind"]: spec.get("params", {})},
        max_model_len=capture_reads.replay_max_model_len(inputs["trace"]) or 0,
        num_gpu_blocks=int(inputs.get("num_gpu_blocks") or 0),  # the live engines' KV
        # Flow control as the cluster's routers run it (on with tenants or a TPOT SLO:
        # services.config): live requests wait there while the fleet is saturated, and
        # that wait is in their TTFT. Or as the job asked: on or off.
        flow=_replay_flow(cluster, mode, bool(tenants)),
        tenants=tenants,
        grey=GreyParams(),  # grey-failure detection as the routers run it by default (on)
        **_disaggregation(cluster, roles),
    )

    def step(done: int, total: int, now: float) -> None:
        progress(done / max(total, 1))

    started = time.perf_counter()
    result = Simulator(records, spec["kind"], config, step).run()
    result.wall_s = time.perf_counter() - started
    done = [r for r in result.requests if r.status == "ok"]
    engine = SimConfig(gpu=config.gpu, model=config.model).engine_config(None)
    out = {
        "summary": _json_safe(summarize(result)),
        "ttft_percentiles": _percentiles(ttfts(done)),
        "instances": instances,
        "requests": len(records),
        "percentiles": TTFT_PERCENTILES,
        "lower_bound": _json_safe(lower_bound_summary(records, engine)[0]),
    }
    selected = _fidelity_positions(cell)
    if selected is not None:
        out["selected"] = _selected_summary(result.requests, selected)
    if config.flow is not None:  # per tenant, by the names the operator knows
        shown = {recorded: name for name, recorded in names.items()}
        out["tenants"] = {
            shown.get(tenant, tenant): _json_safe(row)
            for tenant, row in by_tenant(result.requests).items()
        }
    return out


def _replay_flow(cluster: Cluster, mode: str, has_tenants: bool) -> Any:
    """The FlowParams a replay runs (None: off), with the cluster's TPOT SLO."""
    from router_worker.routing.flow import FlowParams

    tpot_ms = cluster.flow_tpot_slo_ms
    on = mode == "on" or (mode == "cluster" and (has_tenants or tpot_ms is not None))
    return FlowParams(tpot_slo_s=tpot_ms / 1000 if tpot_ms else None) if on else None


def _replay_roles(cluster: Cluster) -> list[str]:
    """The role of each instance a replay simulates: the cluster's instances not down, in
    the order its routing document lists them (by name)."""
    live = cluster.instances.exclude(state="down").order_by("name")
    return list(live.values_list("role", flat=True))


def _disaggregation(cluster: Cluster, roles: list[str]) -> dict[str, Any]:
    """The simulator's disaggregation fields for a cluster whose routers split requests
    (an instance of role prefill or decode: services.config), as its routers run it: the
    instances' roles, the cluster's decider, link and decode policy; nothing for a colocated
    cluster."""
    if all(role == "both" for role in roles):
        return {}
    from router_worker.routing.disagg import in_decode_pool, in_prefill_pool

    for pool, member in (("prefill", in_prefill_pool), ("decode", in_decode_pool)):
        if not any(map(member, roles)):
            raise ReplayFailed(
                f"the cluster's instances that are not down hold no {pool} pool, and a "
                "disaggregated cluster needs both: bring one up or give it role both"
            )
    decode = cluster.decode_policy
    return {
        "roles": tuple(roles),
        "decider": config_service.decider_document(cluster),
        "kv_link": cluster.kv_link,
        **({"decode_policy": decode.kind, "decode_policy_params": decode.params} if decode else {}),
    }


def _replay_tenants(cluster: Cluster, trace: str) -> tuple[tuple[Any, ...], dict[str, str]]:
    """The cluster's tenants as the trace names them, and each name's name in the trace: a
    capture records a tenant as a keyed digest under its salt (the default tenant as it
    is), any other trace by its name."""
    from router_worker.contract.capture import CaptureKey
    from router_worker.routing.flow import TenantSettings

    settings = [config_service.settings_of(tenant) for tenant in cluster.tenants.order_by("name")]
    names = {s["name"]: s["name"] for s in settings}
    names.setdefault(DEFAULT_TENANT, DEFAULT_TENANT)
    if trace.startswith("capture:"):
        capture = cluster.captures.get(pk=replay_service.trace_capture_id(trace))
        key = CaptureKey(capture.salt)
        names = {name: key.tenant(name) for name in names}
    tenants = tuple(
        TenantSettings.model_validate({**s, "name": names[s["name"]]}) for s in settings
    )
    return tenants, names


def _fidelity_positions(cell: ReplayCell) -> set[int] | None:
    """For the cell the job holds against live measurements (its policy at the captured
    rate): the positions of the captured requests that policy served live, whose replayed
    latencies are compared with the measured ones."""
    inputs = cell.job.inputs
    selection = inputs.get("fidelity") or {}
    versions = selection.get("versions")
    if not versions or selection.get("policy") != cell.policy or cell.rate_scale != 1.0:
        return None
    return capture_reads.selected_positions(
        replay_service.trace_capture_id(inputs["trace"]),
        inputs.get("max_requests"),
        inputs.get("capture_until"),
        versions,
    )


def _selected_summary(requests: list[Any], positions: set[int]) -> dict[str, Any]:
    """Mean and p99 TTFT and TPOT of the replayed requests at ``positions`` (the replay's
    request ids are ``r<position>``)."""
    from enginesim.replay.metrics import tpot_of, ttft_of

    chosen = [r for r in requests if int(r.id[1:]) in positions]
    done = [r for r in chosen if r.status == "ok"]
    ttft = np.array([ttft_of(r) for r in done])
    tpot = np.array([tpot_of(r) for r in done if r.output_tokens > 1])
    return {
        "requests": len(chosen),
        "completed": len(done),
        "ttft_mean_s": float(ttft.mean()) if len(ttft) else None,
        "ttft_p99_s": percentile(ttft, 99) if len(ttft) else None,
        "tpot_mean_s": float(tpot.mean()) if len(tpot) else None,
        "tpot_p99_s": percentile(tpot, 99) if len(tpot) else None,
    }


def _percentiles(values: np.ndarray) -> list[float] | None:
    if len(values) == 0:
        return None
    # not empty: no percentile is None
    return cast("list[float]", [percentile(values, q) for q in TTFT_PERCENTILES])


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


# ----------------------------------------------------------------- task


class _Throttled:
    """Records a cell's progress at most every PROGRESS_EVERY_S."""

    def __init__(self, cell_id: int) -> None:
        self.cell_id, self.last = cell_id, 0.0

    def __call__(self, fraction: float) -> None:
        now = time.monotonic()
        if now - self.last >= PROGRESS_EVERY_S:
            self.last = now
            replay_cells.record_progress(self.cell_id, fraction)


class _Heartbeat:
    """While a cell runs, its heartbeat every `HEARTBEAT_S` from a thread of its own: the
    sweeper (replays.fail_abandoned) then fails only a cell whose worker died, never one
    loading a large trace or simulating a long one between progress reports."""

    def __init__(self, cell_id: int, every_s: float | None = None) -> None:
        self.cell_id, self.every_s = cell_id, every_s or HEARTBEAT_S
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._beat, name=f"heartbeat-{cell_id}", daemon=True)

    def __enter__(self) -> _Heartbeat:
        try:
            self.thread.start()
        except RuntimeError as error:  # no room for a thread (a worker near its memory cap)
            log.warning("replay cell %s runs without heartbeats: %s", self.cell_id, error)
        return self

    def __exit__(self, *_: object) -> None:
        self.stopped.set()
        if self.thread.is_alive():
            self.thread.join(timeout=10)

    def _beat(self) -> None:
        try:
            while not self.stopped.wait(self.every_s):
                try:
                    replay_cells.heartbeat(self.cell_id)
                except Exception as error:  # the database away a moment: try again later
                    log.warning("replay cell %s heartbeat: %s", self.cell_id, error)
        finally:
            connection.close()  # this thread's own


# The hard limit must exceed the soft one: left unset it is the app's default (90 s), and
# the worker would be killed in the middle of any replay longer than that.
@shared_task(
    name="switchyard.replay_cell",
    bind=True,
    soft_time_limit=3600,
    time_limit=3660,
    max_retries=CELL_RETRIES,
    ignore_result=False,  # the chord counts its cells' results
)
def replay_cell(self: Any, cell_id: int) -> str:
    """Run one queued cell; returns its final state ("skipped": unknown or taken)."""
    cell = replay_cells.claim_cell(cell_id, f"{self.request.hostname} pid {os.getpid()}")
    if cell is None:
        return "skipped"
    try:
        result, error = _outcome(cell)
    except Exception as unexpected:  # not the replay's fault as far as we know: retry
        if self.request.retries < CELL_RETRIES:
            log.warning("replay cell %s: %s; retrying", cell_id, unexpected)
            replay_cells.requeue(cell_id)
            raise self.retry(countdown=RETRY_AFTER_S) from None
        result, error = None, f"{type(unexpected).__name__}: {unexpected} (tried {cell.attempts}×)"
    state = replay_cells.finish_cell(cell_id, result=result, error=error)
    replay_finish(cell.job_id)  # the last cell to end ends the job (before: a no-op)
    return state


@shared_task(name="switchyard.replay_finish", ignore_result=True)
def replay_finish(job_id: int) -> str | None:
    """The job's results once its cells have ended (each cell's task runs it; so did the
    chord that joined jobs queued before). It always ends a settled job: should finishing
    raise, the job is failed with the reason."""
    try:
        return replay_cells.finish_job(job_id)
    except Exception as error:
        log.exception("replay %s could not be finished", job_id)
        return replay_cells.fail_job(
            job_id, f"the job could not be finished: {type(error).__name__}: {error}"
        )


def run_replay(job_id: int) -> str:
    """Every cell of a job in this process, then its results: what the workers do, without
    them (the CLI-less path the tests and a one-off run use). The job's final state."""
    for cell_id in replay_cells.cells_of(ReplayJob.objects.get(pk=job_id)):
        cell = replay_cells.claim_cell(cell_id, "inline")
        if cell is not None:
            result, error = _outcome(cell)
            replay_cells.finish_cell(cell_id, result=result, error=error)
    return replay_cells.finish_job(job_id) or ReplayJob.objects.get(pk=job_id).state


def _outcome(cell: ReplayCell) -> tuple[dict[str, Any] | None, str]:
    """(results, "") or (None, the reason shown to the operator). A replay that runs out of
    memory fails its cell like any other error: the worker lives on, and the cell's memory
    is released (with the traceback) before the failure is recorded."""
    try:
        with _Heartbeat(cell.pk):
            return run_cell(cell, _Throttled(cell.pk)), ""
    except (ReplayFailed, ServiceError, OSError, ValueError, KeyError) as error:
        log.warning("replay cell %s failed: %s", cell.pk, error)
        return None, str(error)
    except SoftTimeLimitExceeded:
        return None, TIME_LIMIT
    except MemoryError:
        log.error("replay cell %s ran out of memory", cell.pk)
        return None, OUT_OF_MEMORY
