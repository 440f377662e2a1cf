from __future__ import annotations

from celery import shared_task

from controlplane.services import replays
from controlplane.services.health import probe_dependencies


@shared_task(name="switchyard.ping", acks_late=True, reject_on_worker_lost=True)
def ping() -> dict:
    """Report, from inside a worker, whether the database and Redis answer (idempotent)."""
    return probe_dependencies().as_dict()


@shared_task(name="switchyard.prune_uploads", acks_late=True, reject_on_worker_lost=True)
def prune_uploads() -> int:
    """Delete uploaded replay traces past their retention that no pending job needs."""
    return replays.prune_uploads()
