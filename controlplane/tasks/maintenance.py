from __future__ import annotations

from celery import shared_task

from controlplane.services.health import probe_dependencies


@shared_task(name="switchyard.ping", acks_late=True, reject_on_worker_lost=True)
def ping() -> dict:
    """Report, from inside a worker, whether the database and Redis answer (idempotent)."""
    return probe_dependencies().as_dict()
