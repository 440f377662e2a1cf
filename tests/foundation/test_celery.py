"""A task executed by a real Celery worker consuming from the real Redis broker."""

from __future__ import annotations

import pytest
from celery.contrib.testing.worker import start_worker

from controlplane.celery import app
from controlplane.tasks import ping


@pytest.fixture(scope="module")
def celery_worker_on_redis():
    import celery.contrib.testing.tasks  # noqa: F401  registers celery.ping for the ready check

    with start_worker(
        app, pool="solo", concurrency=1, perform_ping_check=True, shutdown_timeout=10
    ) as worker:
        yield worker


@pytest.mark.django_db(transaction=True)
def test_task_runs_in_a_worker_and_reports_dependencies(celery_worker_on_redis) -> None:
    assert app.conf.broker_url.startswith("redis://")
    result = ping.delay()
    assert result.get(timeout=30) == {"database": "ok", "redis": "ok"}


def test_reliability_settings_are_deliberate() -> None:
    assert app.conf.worker_prefetch_multiplier == 1
    assert app.conf.task_acks_late is False
    assert app.conf.broker_connection_retry_on_startup is True
    assert app.conf.task_soft_time_limit < app.conf.task_time_limit
    assert ping.acks_late is True  # ping is idempotent, so redelivery is safe
