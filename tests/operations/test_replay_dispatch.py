"""Queued replays that never reached a worker are sent again; a job runs at most once."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.utils import timezone

from controlplane.models import ReplayJob
from controlplane.services import replays

pytestmark = pytest.mark.django_db


QUEUE = "replays"  # not "default": a replay must not hold up ingest or the canary judge


def queued_replay_messages(client: redis.Redis) -> list[bytes | str]:
    return [
        m
        for m in client.lrange(QUEUE, 0, -1)
        if json.loads(m)["headers"].get("task") == replays.REPLAY_TASK
    ]


def test_stale_queued_jobs_are_dispatched_again_and_claimed_once(cluster):
    stale = ReplayJob.objects.create(cluster=cluster, inputs={"trace": "shared:x.jsonl"})
    fresh = ReplayJob.objects.create(cluster=cluster, inputs={"trace": "shared:x.jsonl"})
    ReplayJob.objects.filter(pk=stale.pk).update(created_at=timezone.now() - timedelta(hours=1))
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    try:
        for message in queued_replay_messages(client):
            client.lrem(QUEUE, 0, message)  # type: ignore[arg-type]  # stub: a str value only
        assert replays.redispatch_stale(older_than_s=60) == 1
        sent = queued_replay_messages(client)
        for message in sent:
            client.lrem(QUEUE, 0, message)  # type: ignore[arg-type]  # stub: a str value only
    finally:
        client.close()
    assert [json.loads(m)["headers"]["argsrepr"] for m in sent] == [f"[{stale.pk}]"]
    assert replays.claim(stale.pk) is not None
    assert replays.claim(stale.pk) is None  # a second delivery does not run it again
    assert ReplayJob.objects.get(pk=fresh.pk).state == "queued"


def test_running_jobs_whose_worker_went_silent_are_failed_with_a_reason(cluster):
    silent, alive, queued, legacy = (
        ReplayJob.objects.create(cluster=cluster, inputs={}) for _ in range(4)
    )
    for job in (silent, alive):
        assert replays.claim(job.pk) is not None
    # claimed before heartbeats existed: no heartbeat, created long ago
    ReplayJob.objects.filter(pk=legacy.pk).update(
        state="running", created_at=timezone.now() - timedelta(hours=2)
    )
    replays.record_progress(alive.pk, 0.4)
    ReplayJob.objects.filter(pk=silent.pk).update(
        heartbeat_at=timezone.now() - timedelta(minutes=10)
    )
    ReplayJob.objects.filter(pk=queued.pk).update(created_at=timezone.now() - timedelta(hours=1))

    assert replays.fail_abandoned(older_than_s=300) == 2

    silent.refresh_from_db()
    assert silent.state == "failed" and "worker" in silent.error and silent.finished_at
    assert ReplayJob.objects.get(pk=alive.pk).state == "running"
    assert ReplayJob.objects.get(pk=queued.pk).state == "queued"  # redispatch's business
    assert ReplayJob.objects.get(pk=legacy.pk).state == "failed"


def test_every_task_hard_time_limit_exceeds_its_soft_one():
    """A hard limit at or below the soft one kills the worker before the task can react
    (run_replay once had soft 3600 s and the app's default hard 90 s)."""
    from controlplane.celery import app

    app.loader.import_default_modules()
    tasks = [task for name, task in app.tasks.items() if name.startswith("switchyard.")]
    assert any(task.name == replays.REPLAY_TASK for task in tasks)
    for task in tasks:
        if task.soft_time_limit is not None and task.time_limit is not None:
            assert task.time_limit > task.soft_time_limit, task.name
