"""The what-if replay task: a job's trace through enginesim's discrete-event simulator, once
per chosen policy, on the cluster's model and GPU, with progress and results on the job.

The adapter below is the only place that knows enginesim's replay API; the task is thin.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, cast

import numpy as np
from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded

from controlplane.models import Cluster, ReplayJob
from controlplane.services import replays as replay_service
from controlplane.services.errors import ServiceError
from controlplane.services.traces import check_trace
from engine_interface import percentile

log = logging.getLogger(__name__)
ENGINE_UNAVAILABLE = "replay engine unavailable"
OUT_OF_MEMORY = (
    "the replay ran out of memory on its worker; choose fewer requests "
    "(max requests) or a smaller trace"
)
TIME_LIMIT = "the replay ran past its one-hour limit; choose fewer requests or policies"
PROGRESS_EVERY_S = 0.5
TTFT_PERCENTILES = list(range(1, 100))

Progress = Callable[[float], None]


class ReplayFailed(Exception):
    """A replay that cannot run; the message is shown to the operator."""


# ----------------------------------------------------------------- adapter (enginesim)


def simulator_model(cluster: Cluster) -> str:
    """enginesim's model key for the cluster's served model (key or served name)."""
    from enginesim.engine import MODELS

    wanted = cluster.model.lower()
    for key, spec in MODELS.items():
        if wanted in (key, spec.served_name.lower()):
            return key
    raise ReplayFailed(
        f"enginesim has no cost model for {cluster.model!r}; known: {sorted(MODELS)}"
    )


def simulator_gpu(cluster: Cluster) -> str:
    from enginesim.engine import GPUS

    if cluster.gpu_type.lower() not in GPUS:
        raise ReplayFailed(f"enginesim has no GPU {cluster.gpu_type!r}; known: {sorted(GPUS)}")
    return cluster.gpu_type.lower()


def run_policies(cluster: Cluster, inputs: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """Replay the job's trace once per policy; the results object stored on the job."""
    try:
        from enginesim.replay.metrics import lower_bound_summary, summarize, ttfts
        from enginesim.replay.simulator import SimConfig, Simulator
        from enginesim.replay.traces import load_trace
    except ImportError as error:
        raise ReplayFailed(f"{ENGINE_UNAVAILABLE}: {error}") from None
    try:
        path = replay_service.trace_file(cluster.pk, inputs["trace"])
    except ServiceError as error:
        raise ReplayFailed(error.message) from None
    check_trace(path, cluster.model)  # again: the file or the cluster's model may have changed
    records = load_trace(
        path, rate_scale=inputs["rate_scale"], max_requests=inputs.get("max_requests")
    )
    if not records:
        raise ReplayFailed("the trace selection holds no request")
    instances = max(cluster.instances.exclude(state="down").count(), 1)
    specs = inputs["policies"]
    outcomes = []
    for index, spec in enumerate(specs):
        config = SimConfig(
            instances=instances,
            gpu=simulator_gpu(cluster),
            model=simulator_model(cluster),
            seed=int(inputs.get("seed", 0)),
            policy_params={spec["kind"]: spec.get("params", {})},
        )

        def step(done: int, total: int, now: float, index: int = index) -> None:
            progress((index + done / max(total, 1)) / len(specs))

        started = time.perf_counter()
        result = Simulator(records, spec["kind"], config, step).run()
        result.wall_s = time.perf_counter() - started
        done = [r for r in result.requests if r.status == "ok"]
        outcomes.append(
            {
                "kind": spec["kind"],
                "params": spec.get("params", {}),
                "summary": _json_safe(summarize(result)),
                "ttft_percentiles": _percentiles(ttfts(done)),
            }
        )
    engine = SimConfig(gpu=simulator_gpu(cluster), model=simulator_model(cluster)).engine_config(
        None
    )
    return {
        "policies": outcomes,
        "instances": instances,
        "requests": len(records),
        "percentiles": TTFT_PERCENTILES,
        "lower_bound": _json_safe(lower_bound_summary(records, engine)[0]),
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
    """Records progress on the job at most every PROGRESS_EVERY_S."""

    def __init__(self, job_id: int) -> None:
        self.job_id, self.last = job_id, 0.0

    def __call__(self, fraction: float) -> None:
        now = time.monotonic()
        if now - self.last >= PROGRESS_EVERY_S:
            self.last = now
            replay_service.record_progress(self.job_id, fraction)


# The hard limit must exceed the soft one: left unset it is the app's default (90 s), and
# the worker would be killed in the middle of any replay longer than that.
@shared_task(name="switchyard.run_replay", soft_time_limit=3600, time_limit=3660)
def run_replay(job_id: int) -> str:
    """Run a queued replay job; returns its final state."""
    job = replay_service.claim(job_id)
    if job is None:
        return "skipped"  # unknown, or already taken by another delivery
    results, error = _outcome(job)
    return replay_service.finish(job_id, results=results, error=error)


def _outcome(job: ReplayJob) -> tuple[dict[str, Any] | None, str]:
    """(results, "") or (None, the reason shown to the operator). A replay that runs out of
    memory fails its job like any other error: the worker lives on, and the job's memory is
    released (with the traceback) before the failure is recorded."""
    try:
        return run_policies(job.cluster, job.inputs, _Throttled(job.pk)), ""
    except (ReplayFailed, ServiceError, OSError, ValueError, KeyError) as error:
        log.warning("replay %s failed: %s", job.pk, error)
        return None, str(error)
    except SoftTimeLimitExceeded:
        return None, TIME_LIMIT
    except MemoryError:
        log.error("replay %s ran out of memory", job.pk)
        return None, OUT_OF_MEMORY
