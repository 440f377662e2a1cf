"""What-if replay jobs: a queued row (audited) handed to a Celery worker by task name."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from controlplane.models import Cluster, ConfigVersion, Policy, ReplayCell, ReplayJob
from controlplane.selectors import captures as capture_reads
from router_worker.routing.features import DEFAULT_TENANT

from . import audit, captures, policy_defaults, replay_cells, traces
from .audit import Actor
from .clusters import locked_cluster
from .errors import NotFound, Problems, ServiceError
from .validation import normalised_params

log = logging.getLogger(__name__)

CELL_TASK = "switchyard.replay_cell"
FINISH_TASK = "switchyard.replay_finish"
MAX_POLICIES = 8
MAX_RATE_SCALES = 4
MAX_RATE_SCALE = 1000.0
MAX_SEEDS = 10
MAX_CELLS = 160
MAX_REQUESTS = 10_000_000  # requests a replay takes from its trace, at most
# Flow control in a replay: as the cluster's routers run it (on with tenants), or forced.
FLOW_MODES = ("cluster", "on", "off")
MAX_TENANT_SCALE = 10.0  # "what if this tenant sends N times as much", at most
# A running job reports progress every half second; this much silence means its worker died.
ABANDONED_AFTER_S = 300.0
RESEND_AFTER_S = 3600.0  # a queued job sent this long ago is sent again (its queued cells)
EXPORT_RETENTION_S = 86400.0  # a capture's export for a finished job: rewritten if needed
ABANDONED_ERROR = (
    "the worker running this replay stopped before it finished (killed, "
    "restarted or out of memory); request it again"
)


@dataclass(frozen=True)
class ReplayRequest:
    job: ReplayJob
    dispatched: bool
    message: str


def replay_snapshot(job: ReplayJob) -> dict[str, Any]:
    return {"state": job.state, "inputs": job.inputs}


def request_replay(
    actor: Actor,
    cluster_id: int,
    *,
    trace: str,
    policies: list[dict[str, Any]],
    rate_scale: float = 1.0,
    rate_scales: list[float] | None = None,
    max_requests: int | None = None,
    seed: int = 0,
    seeds: int = 1,
    policy_ids: list[int] | None = None,
    flow: str = "cluster",
    tenant_scales: dict[str, float] | None = None,
    reason: str = "",
) -> ReplayRequest:
    """Create the queued job (committed), then send it to the workers. A broker outage does
    not lose the job: it stays queued and the answer says it was not dispatched. Every
    input, every row of the trace included, is checked first and every problem refused
    together (outside the cluster lock: a big trace takes a while).

    The job runs one cell per policy, load and seed: ``rate_scales`` (default
    ``[rate_scale]``) times ``seeds`` seeds from ``seed`` on. ``policy_ids``: the cluster's
    policies the specs came from (the form's choice), so the job's page can mark the active
    one and recommend another as a canary.

    ``flow``: the routers' flow control in the replay, ``cluster`` as the cluster runs it
    (on when it has tenants), ``on`` or ``off``; ``tenant_scales``: per tenant of the
    cluster (or ``default``), its requests that many times as many (what if it doubles:
    2), as ``enginesim replay --tenant-scale``."""
    inputs = _checked_inputs(
        cluster_id,
        trace=trace,
        policies=policies,
        rate_scales=[rate_scale] if rate_scales is None else rate_scales,
        max_requests=max_requests,
        seed=seed,
        seeds=seeds,
        flow=flow,
        tenant_scales=tenant_scales or {},
    )
    if policy_ids is not None:
        inputs["policy_ids"] = _policy_ids(cluster_id, policy_ids, len(policies))
    return dispatch_job(_create_job(actor, cluster_id, inputs, reason=reason))


def request_uploaded_replay(
    actor: Actor, cluster_id: int, *, filename: str, chunks: Iterable[bytes], **options: Any
) -> ReplayRequest:
    """Store an operator's trace file and request a replay of it; the file is deleted again
    when it or the request is refused, so refused uploads do not pile up on disk."""
    trace = traces.store_upload(filename, chunks)
    try:
        return request_replay(actor, cluster_id, trace=trace, **options)
    except BaseException:  # refused, or anything else: no upload stays behind without a job
        traces.discard_upload(trace)
        raise


def _checked_inputs(
    cluster_id: int,
    *,
    trace: str,
    policies: list[dict[str, Any]],
    rate_scales: list[float],
    max_requests: int | None,
    seed: int,
    seeds: int,
    flow: str = "cluster",
    tenant_scales: dict[str, float] | None = None,
) -> dict[str, Any]:
    cluster = Cluster.objects.filter(pk=cluster_id).first()
    if cluster is None:
        raise NotFound(f"cluster {cluster_id} does not exist")
    problems = Problems()
    trace = problems.check(_validated_trace, trace, cluster) or ""
    if trace and not trace.startswith("capture:"):  # a capture's rows were checked at ingest
        problems.check(traces.check_trace, traces.resolve_trace(trace), cluster.model)
    problems.check(_validated_policies, policies, cluster)
    scales = problems.check(_rate_scales, rate_scales) or []
    seed = problems.check(_seed, seed) or 0
    count = problems.check(_seed_count, seeds) or 1
    inputs = {
        "trace": trace,
        "policies": policies,  # completed under the lock, in _create_job
        "rate_scales": scales,
        "rate_scale": scales[0] if scales else None,  # the first load, as jobs had one
        "max_requests": None
        if max_requests is None
        else problems.check(_positive_int, max_requests, "max_requests"),
        "seed": seed,
        "seeds": list(range(seed, seed + count)),
        "flow": problems.check(_flow_mode, flow),
        "tenant_scales": problems.check(_tenant_scales, tenant_scales or {}, cluster) or {},
    }
    if trace.startswith("capture:"):  # every cell replays the capture as it is now
        capture = captures.require_replayable(cluster.pk, trace_capture_id(trace))
        inputs["capture_until"] = capture_reads.last_row(capture)
    if isinstance(policies, list) and len(policies) * len(scales) * count > MAX_CELLS:
        problems.found.append(
            {
                "field": "seeds",
                "message": f"policies × rate scales × seeds must be at most {MAX_CELLS} "
                f"cells, got {len(policies) * len(scales) * count}",
            }
        )
    problems.raise_any()
    return inputs


def _flow_mode(value: Any) -> str:
    if value not in FLOW_MODES:
        raise ServiceError(f"flow must be one of {', '.join(FLOW_MODES)}", "flow")
    return str(value)


def _tenant_scales(scales: Any, cluster: Cluster) -> dict[str, float]:
    """Each named tenant (the cluster's, or ``default``) with a factor in [0, 10]."""
    if not isinstance(scales, dict) or len(scales) > MAX_POLICIES:
        raise ServiceError(
            f"tenant_scales must map at most {MAX_POLICIES} tenants to factors", "tenant_scales"
        )
    known = set(cluster.tenants.values_list("name", flat=True)) | {DEFAULT_TENANT}
    out: dict[str, float] = {}
    for tenant, factor in scales.items():
        if tenant not in known:
            raise ServiceError(
                f"tenant_scales: {str(tenant)[:64]!r} is not a tenant of {cluster.name} "
                f"(its tenants: {', '.join(sorted(known))})",
                "tenant_scales",
            )
        if (
            isinstance(factor, bool)
            or not isinstance(factor, int | float)
            or not 0 <= factor <= MAX_TENANT_SCALE
        ):
            raise ServiceError(
                f"tenant_scales: {tenant}'s factor must be a number in [0, "
                f"{MAX_TENANT_SCALE:g}], got {factor!r}",
                "tenant_scales",
            )
        out[tenant] = float(factor)
    return out


def _policy_ids(cluster_id: int, ids: Any, count: int) -> list[int]:
    known = set(Policy.objects.filter(cluster_id=cluster_id).values_list("pk", flat=True))
    if not isinstance(ids, list) or len(ids) != count or not set(ids) <= known:
        raise ServiceError("policy_ids must name the cluster's policies, one per spec", "policies")
    return ids


def _rate_scales(values: Any) -> list[float]:
    if not isinstance(values, list) or not 1 <= len(values) <= MAX_RATE_SCALES:
        raise ServiceError(f"rate_scales must list 1-{MAX_RATE_SCALES} rates", "rate_scales")
    scales = [_positive(value, "rate_scales") for value in values]
    if len(set(scales)) != len(scales):
        raise ServiceError("rate_scales must not repeat a rate", "rate_scales")
    if max(scales) > MAX_RATE_SCALE:
        raise ServiceError(f"rate_scales must be at most {MAX_RATE_SCALE:g}", "rate_scales")
    return scales


def _seed(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**31 - 64:
        raise ServiceError("seed must be a whole number from 0 to 2147483583", "seed")
    return value


def _seed_count(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_SEEDS:
        raise ServiceError(f"seeds must be a whole number from 1 to {MAX_SEEDS}", "seeds")
    return value


def prune_uploads() -> int:
    """Delete uploaded traces older than the retention period, and capture exports (one a
    replay job, written by its workers) older than a day, that no waiting or running job
    still needs (refused uploads are deleted at once; this catches the rest)."""
    pending = ReplayJob.objects.filter(state__in=[ReplayJob.State.QUEUED, ReplayJob.State.RUNNING])
    keep = {str(job.inputs.get("trace")) for job in pending.only("inputs")}
    exports = {
        captures.export_path(int(trace.split(":", 1)[1]), job.inputs.get("capture_until")).name
        for job in pending.only("inputs")
        if (trace := str(job.inputs.get("trace", ""))).startswith("capture:")
        and trace.split(":", 1)[1].isdigit()
    }
    retention = settings.SWITCHYARD_UPLOAD_RETENTION_DAYS * 86400
    return traces.prune_uploads(retention, keep) + captures.prune_exports(
        EXPORT_RETENTION_S, exports
    )


@transaction.atomic
def _create_job(actor: Actor, cluster_id: int, inputs: dict[str, Any], *, reason: str) -> ReplayJob:
    cluster = locked_cluster(cluster_id)
    # the cost coefficients are derived under the lock, from the GPU and model the
    # cluster has now
    inputs = {
        **inputs,
        "policies": _validated_policies(inputs["policies"], cluster),
        "active_policy_id": cluster.active_policy_id,  # the row the results mark
    }
    selection = fidelity_selection(cluster, inputs)
    if selection is not None:
        inputs["fidelity"] = selection
    blocks = kv_blocks_per_instance(cluster)
    if blocks:  # the engines' KV capacity as they report it (else the GPU's default)
        inputs["num_gpu_blocks"] = blocks
    job = ReplayJob.objects.create(cluster=cluster, inputs=inputs, created_by=actor.account)
    replay_cells.create_cells(job)
    audit.record(
        actor, "replay.create", job, after=replay_snapshot(job), reason=reason, cluster=cluster
    )
    return job


def _validated_trace(trace: str, cluster: Cluster) -> str:
    """`shared:<file>` or `upload:<file>` naming a trace that exists now, so a typo is
    refused at once instead of failing in a worker later; `capture:<id>`, one of the
    cluster's traffic captures, exported now (a running capture as far as it got)."""
    trace = (trace or "").strip()
    if not trace or len(trace) > 256:
        raise ServiceError("trace must name a trace (1-256 characters)", "trace")
    if trace.startswith("capture:"):
        captures.require_replayable(cluster.pk, trace_capture_id(trace))
        return trace
    if not traces.resolve_trace(trace).is_file():
        raise ServiceError(f"trace {trace!r} does not exist", "trace")
    return trace


def trace_file(cluster_id: int, inputs: dict[str, Any]) -> Path:
    """The file a worker replays: a capture is exported from Postgres there and then, so a
    worker on any host replays it, as far as the job pinned it (``capture_until``)."""
    trace = inputs["trace"]
    if trace.startswith("capture:"):
        until = inputs.get("capture_until")
        return captures.export_for_replay(cluster_id, trace_capture_id(trace), until)
    return traces.resolve_trace(trace)


def trace_capture_id(trace: str) -> int:
    name = trace.removeprefix("capture:")
    if not (name.isascii() and name.isdigit() and len(name) < 19):
        raise ServiceError(f"trace {trace!r} does not name a capture", "trace")
    return int(name)


def _validated_policies(policies: list[dict[str, Any]], cluster: Cluster) -> list[dict[str, Any]]:
    """Each spec validated by its policy's class; unset cost coefficients derived from the
    cluster's GPU and model (the replay runs on those). Every spec's problems are refused
    together, each under ``policies.<index>``."""
    if not isinstance(policies, list) or not 1 <= len(policies) <= MAX_POLICIES:
        raise ServiceError(f"policies must list 1-{MAX_POLICIES} policies", "policies")
    problems = Problems()
    validated = [
        problems.check(_validated_policy, spec, cluster, prefix=f"policies.{index}")
        for index, spec in enumerate(policies)
    ]
    problems.raise_any()
    return [spec for spec in validated if spec is not None]


def kv_blocks_per_instance(cluster: Cluster) -> int:
    """The KV blocks of the cluster's instances as their engines last reported them (the
    smallest, so a replay never holds more than any engine could); 0 when none has."""
    scrapes = cluster.instances.exclude(state="down").values_list("last_scrape", flat=True)
    blocks = [
        value
        for scrape in scrapes
        if isinstance(scrape, dict)
        and isinstance(value := scrape.get("engine_kv_blocks"), int | float)
        and not isinstance(value, bool)
        and 0 < value < 2**31
    ]
    return int(min(blocks)) if blocks else 0


def fidelity_selection(cluster: Cluster, inputs: dict[str, Any]) -> dict[str, Any] | None:
    """For a replay of captured traffic: which replayed policy to hold against what the
    routers measured live, and on which of the captured requests: those routed under it on
    the whole cluster (no canary arm), told by the config version each request records.
    Of several replayed policies that served captured requests, the one that served the
    most (of equals, the active one). ``{"policy": index or None, "name", "versions"
    (None: the capture records no versions, so every request), "requests", "of"}``; None
    for other traces."""
    trace = str(inputs.get("trace", ""))
    if not trace.startswith("capture:"):
        return None
    total, by_version, unversioned = capture_reads.whole_cluster_versions(
        trace_capture_id(trace), inputs.get("max_requests"), inputs.get("capture_until")
    )
    specs, ids = inputs["policies"], inputs.get("policy_ids") or []
    active = ids.index(cluster.active_policy_id) if cluster.active_policy_id in ids else None
    if total and unversioned == total:  # captured by routers that did not record versions
        if active is None:
            return None
        return _selection(ids, active, None, total, total)
    documents = dict(
        ConfigVersion.objects.filter(cluster=cluster, number__in=list(by_version)).values_list(
            "number", "document"
        )
    )
    served: dict[int, list[int]] = {}  # replayed policy's index -> versions it ran alone
    for number in sorted(by_version):
        index = _replayed_index((documents.get(number) or {}).get("policy"), specs, cluster)
        if index is not None:
            served.setdefault(index, []).append(number)
    if not served:
        return _selection(ids, None, [], 0, total)

    def weight(index: int) -> tuple[int, bool]:
        return sum(by_version[number] for number in served[index]), index == active

    best = max(served, key=weight)
    return _selection(ids, best, served[best], weight(best)[0], total)


def _selection(
    ids: list[int], index: int | None, versions: list[int] | None, requests: int, total: int
) -> dict[str, Any]:
    name = None
    if index is not None and index < len(ids):
        name = Policy.objects.filter(pk=ids[index]).values_list("name", flat=True).first()
    return {"policy": index, "name": name, "versions": versions, "requests": requests, "of": total}


def _replayed_index(policy: Any, specs: list[dict[str, Any]], cluster: Cluster) -> int | None:
    """The index among the job's (completed) specs of a config document's policy."""
    if not isinstance(policy, dict):
        return None
    try:
        wanted = _validated_policy(policy, cluster)
    except (ServiceError, ValueError, TypeError):  # a kind or params no longer valid
        return None
    return next((index for index, spec in enumerate(specs) if spec == wanted), None)


def _validated_policy(spec: Any, cluster: Cluster) -> dict[str, Any]:
    spec = spec if isinstance(spec, dict) else {}
    kind = str(spec.get("kind"))
    params = normalised_params(kind, spec.get("params"))
    return {"kind": kind, "params": policy_defaults.complete_params(kind, params, cluster)}


def _positive(value: float, field: str) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value < math.inf:
        raise ServiceError(f"{field} must be a positive number", field)
    return float(value)


def _positive_int(value: int, field: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= MAX_REQUESTS:
        raise ServiceError(f"{field} must be a whole number from 1 to {MAX_REQUESTS}", field)
    return value


def dispatch_job(job: ReplayJob) -> ReplayRequest:
    """A task per queued cell on the ``replays`` queue (any worker on any host takes them).
    No chord joins them: each cell's task ends the job once the last cell has ended
    (replay_cells.finish_job, a no-op before), so a job never waits on a join whose state
    the result backend may have expired. A cell claimed already (a second dispatch)
    returns at once. The job's ``heartbeat_at`` records, while it is queued, when it was
    last sent (`redispatch_stale`)."""
    from celery import group, signature

    cell_ids = replay_cells.cells_of(job)
    queued = set(job.cells.filter(state=ReplayCell.State.QUEUED).values_list("pk", flat=True))
    cells = [
        signature(CELL_TASK, args=[cell_id], immutable=True)
        for cell_id in cell_ids
        if cell_id in queued
    ]
    try:
        if cells:
            group(cells).apply_async(retry=False)
    except Exception as error:  # kombu raises several unrelated types for a broker outage
        log.warning("replay %s not dispatched: %s", job.pk, error)
        return ReplayRequest(
            job,
            False,
            f"replay {job.pk} is saved as queued, but the task "
            f"broker is unreachable ({type(error).__name__}); it will be "
            "sent to a worker when the broker is back",
        )
    ReplayJob.objects.filter(pk=job.pk, state=ReplayJob.State.QUEUED).update(
        heartbeat_at=timezone.now()
    )
    return ReplayRequest(job, True, f"replay {job.pk} queued")


def redispatch_stale(older_than_s: float = 60.0, resend_after_s: float = RESEND_AFTER_S) -> int:
    """Send queued jobs again that no worker has started: one never sent (a broker outage at
    creation) after ``older_than_s``, one sent but still waiting (a lost message, or only
    a long queue ahead of it) after ``resend_after_s``, its queued cells only. Cells are
    claimed atomically, so a cell sent twice still runs once."""
    now = timezone.now()
    never_sent = Q(heartbeat_at__isnull=True, created_at__lt=now - timedelta(seconds=older_than_s))
    long_ago = Q(heartbeat_at__lt=now - timedelta(seconds=resend_after_s))
    stale = ReplayJob.objects.filter(never_sent | long_ago, state=ReplayJob.State.QUEUED)
    return sum(dispatch_job(job).dispatched for job in stale)


def fail_abandoned(older_than_s: float = ABANDONED_AFTER_S) -> int:
    """Fail the cells whose worker has been silent for ``older_than_s`` and end their jobs
    (replay_cells.fail_abandoned); a running job without cells, requested before jobs had
    them, is failed the same way."""
    cutoff = timezone.now() - timedelta(seconds=older_than_s)
    silent = Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True, created_at__lt=cutoff)
    legacy = ReplayJob.objects.filter(silent, state=ReplayJob.State.RUNNING, cells__isnull=True)
    failed = legacy.update(
        state=ReplayJob.State.FAILED,
        error=ABANDONED_ERROR,
        finished_at=timezone.now(),
        progress=0.0,
    )
    return failed + replay_cells.fail_abandoned(older_than_s)
