"""Queued replays that never reached a worker are sent again; a job runs at most once."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.utils import timezone

from controlplane.models import ReplayCell, ReplayJob
from controlplane.services import replay_cells, replays
from tests.broker import queue_key

pytestmark = pytest.mark.django_db


QUEUE = "replays"  # not "default": a replay must not hold up ingest or the canary judge


def queued_replay_messages(client: redis.Redis) -> list[bytes | str]:
    return [
        m
        for m in client.lrange(queue_key(QUEUE), 0, -1)
        if json.loads(m)["headers"].get("task") == replays.CELL_TASK
    ]


INPUTS = {"trace": "shared:x.jsonl", "policies": [{"kind": "round_robin"}]}
RESULT = {  # what a cell stores (controlplane/tasks/replay.py), trimmed to what is read
    "summary": {"requests": 10, "completed": 10, "goodput_rps": 1.0, "ttft_mean_s": 0.5},
    "ttft_percentiles": None,
    "instances": 2,
    "requests": 10,
    "percentiles": [50],
    "lower_bound": {},
}


def job_with_cells(cluster, **inputs) -> ReplayJob:
    job = ReplayJob.objects.create(cluster=cluster, inputs={**INPUTS, **inputs})
    replay_cells.create_cells(job)
    return job


def test_stale_queued_jobs_are_dispatched_again_and_claimed_once(cluster):
    stale = job_with_cells(cluster, seeds=[0, 1])
    fresh = job_with_cells(cluster)
    ReplayJob.objects.filter(pk=stale.pk).update(created_at=timezone.now() - timedelta(hours=1))
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    try:
        for message in queued_replay_messages(client):
            client.lrem(queue_key(QUEUE), 0, message)  # type: ignore[arg-type]  # stub: a str value only
        assert replays.redispatch_stale(older_than_s=60) == 1
        sent = queued_replay_messages(client)
        for message in sent:
            client.lrem(queue_key(QUEUE), 0, message)  # type: ignore[arg-type]  # stub: a str value only
    finally:
        client.close()
    cells = list(stale.cells.values_list("pk", flat=True))
    assert sorted(json.loads(m)["headers"]["argsrepr"] for m in sent) == [
        f"({cell},)" for cell in cells
    ]
    assert replay_cells.claim_cell(cells[0], "w1") is not None
    assert replay_cells.claim_cell(cells[0], "w2") is None  # a second delivery does not run it
    assert ReplayJob.objects.get(pk=stale.pk).state == "running"
    assert ReplayJob.objects.get(pk=fresh.pk).state == "queued"


def test_a_legacy_queued_job_gets_its_cells_when_dispatched_again(cluster):
    legacy = ReplayJob.objects.create(cluster=cluster, inputs={**INPUTS, "rate_scale": 2.0})
    assert replay_cells.cells_of(legacy) and legacy.cells.get().rate_scale == 2.0


def test_cells_whose_worker_went_silent_are_failed_and_their_job_ends(cluster):
    mixed = job_with_cells(cluster, seeds=[0, 1])
    alive = job_with_cells(cluster)
    done, silent = mixed.cells.all()
    for cell in (done, silent, alive.cells.get()):
        assert replay_cells.claim_cell(cell.pk, "w") is not None
    replay_cells.finish_cell(done.pk, result=RESULT)
    replay_cells.record_progress(alive.cells.get().pk, 0.4)
    ReplayCell.objects.filter(pk=silent.pk).update(
        heartbeat_at=timezone.now() - timedelta(minutes=10)
    )
    legacy = ReplayJob.objects.create(cluster=cluster, inputs={})  # running, without cells
    ReplayJob.objects.filter(pk=legacy.pk).update(
        state="running", created_at=timezone.now() - timedelta(hours=2)
    )

    assert replays.fail_abandoned(older_than_s=300) == 2

    silent.refresh_from_db()
    assert silent.state == "failed" and "worker" in silent.error and silent.finished_at
    mixed.refresh_from_db()
    assert mixed.state == "succeeded"  # the cell that finished keeps its results
    assert mixed.results is not None
    assert [c["seed"] for c in mixed.results["failed_cells"]] == [silent.seed]
    assert ReplayJob.objects.get(pk=alive.pk).state == "running"
    assert ReplayJob.objects.get(pk=legacy.pk).state == "failed"


def test_every_task_hard_time_limit_exceeds_its_soft_one():
    """A hard limit at or below the soft one kills the worker before the task can react
    (the replay task once had soft 3600 s and the app's default hard 90 s)."""
    from controlplane.celery import app

    app.loader.import_default_modules()
    tasks = [task for name, task in app.tasks.items() if name.startswith("switchyard.")]
    assert any(task.name == replays.CELL_TASK for task in tasks)
    for task in tasks:
        if task.soft_time_limit is not None and task.time_limit is not None:
            assert task.time_limit > task.soft_time_limit, task.name
