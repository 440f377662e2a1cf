"""Beat-driven upkeep of clusters and routers. Each task is a thin call into a service."""

from __future__ import annotations

from celery import shared_task

from controlplane.models import Cluster
from controlplane.router_hosts import supervisor
from controlplane.services import (
    captures,
    ingest,
    instance_health,
    judge,
    notify,
    reconcile,
    replay_cells,
    replays,
    rollups,
)

IDEMPOTENT = {"acks_late": True, "reject_on_worker_lost": True}


@shared_task(name="switchyard.reconcile", **IDEMPOTENT)
def reconcile_all() -> dict[str, list[str]]:
    with notify.redis_client() as client:
        results = reconcile.reconcile_all(client)
    return {r.cluster: r.actions for r in results}


@shared_task(name="switchyard.restart_router")
def restart_router(router_id: int) -> bool:
    """Runs on the router host's own queue, in the worker that supervises the router: a
    router that still answers is left alone (its heartbeats are what got lost)."""
    running = supervisor.current()
    return running.restart_if_unresponsive(router_id) if running is not None else False


@shared_task(name="switchyard.scrape_instances", **IDEMPOTENT, soft_time_limit=20)
def scrape_instances() -> dict[str, dict[str, bool]]:
    return {c.name: instance_health.scrape_cluster(c) for c in Cluster.objects.all()}


@shared_task(name="switchyard.ingest_events", **IDEMPOTENT)
def ingest_events() -> dict[str, object]:
    with notify.redis_client() as client:
        return vars(ingest.ingest_events(client))


@shared_task(name="switchyard.ingest_metrics", **IDEMPOTENT)
def ingest_metrics() -> dict[str, object]:
    with notify.redis_client() as client:
        return vars(ingest.ingest_metrics(client))


@shared_task(name="switchyard.ingest_captures", **IDEMPOTENT)
def ingest_captures() -> dict[str, object]:
    """Captured requests into their captures, then the captures' duration and retention."""
    with notify.redis_client() as client:
        result = vars(ingest.ingest_captures(client))
    return result | captures.enforce_limits()


@shared_task(name="switchyard.judge_canaries")
def judge_canaries() -> dict[str, dict]:
    run = judge.judge_progressing()
    return {"verdicts": run.verdicts, "skipped": run.skipped}


@shared_task(name="switchyard.prune", **IDEMPOTENT)
def prune() -> dict[str, int]:
    return rollups.prune()


@shared_task(name="switchyard.redispatch_replays", **IDEMPOTENT)
def redispatch_replays() -> int:
    """Send queued jobs no worker took again; fail running jobs whose worker died; end
    running jobs whose cells have all ended (should a cell's own finish have failed)."""
    return replays.redispatch_stale() + replays.fail_abandoned() + replay_cells.finish_settled()
