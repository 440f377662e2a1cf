"""A replay job always ends: each cell's task ends its job when it is
the last (no chord state to expire), finishing never leaves a job running whatever it
raises, a cell beats its heart while it loads and simulates, a trace spanning more
simulated time than a replay simulates is refused with its reason, and a job queued behind
long replays is not sent again every minute."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.utils import timezone

from controlplane.models import CapturedRequest, ReplayCell, ReplayJob, TrafficCapture
from controlplane.services import replay_cells, replays
from controlplane.tasks import replay as replay_tasks
from devharness import wait_until
from tests.broker import queue_key
from tests.web.helpers import TRACE

RESULT = {
    "summary": {"requests": 10, "completed": 10, "goodput_rps": 1.0, "ttft_mean_s": 0.5},
    "ttft_percentiles": None,
    "instances": 2,
    "requests": 10,
    "percentiles": [50],
    "lower_bound": {},
}
INPUTS = {"trace": "shared:x.jsonl", "policies": [{"kind": "round_robin"}]}


def _job(cluster, **inputs) -> ReplayJob:
    job = ReplayJob.objects.create(cluster=cluster, inputs={**INPUTS, **inputs})
    replay_cells.create_cells(job)
    return job


@pytest.mark.django_db
def test_the_last_cell_ends_its_job_without_a_join(cluster, traces) -> None:
    job = _job(cluster, trace=f"shared:{TRACE}", max_requests=20, seeds=[0, 1])
    first, second = job.cells.values_list("pk", flat=True)
    assert replay_tasks.replay_cell.apply(args=[first]).get() == "succeeded"
    assert ReplayJob.objects.get(pk=job.pk).state == "running"
    assert replay_tasks.replay_cell.apply(args=[second]).get() == "succeeded"
    job.refresh_from_db()
    assert job.state == "succeeded" and job.results is not None


@pytest.mark.django_db
def test_finishing_a_job_never_leaves_it_running(cluster) -> None:
    """A job asked for with max_requests=1e300 (as the web form allowed): its cells ran, then
    combining their results reached the database with a LIMIT no bigint holds, and the
    join raised; the job stayed running for ever."""
    capture = TrafficCapture.objects.create(
        cluster=cluster, name="c", salt="s" * 64, requests=1, max_requests=10, max_duration_s=60
    )
    CapturedRequest.objects.create(
        capture=capture,
        batch="b",
        router="r0",
        at=1.0,
        prompt_tokens=10,
        output_tokens=2,
        block_size=16,
        status=200,
        ttft_s=0.1,
        tpot_s=0.01,
    )
    active = cluster.active_policy
    job = _job(
        cluster,
        trace=f"capture:{capture.pk}",
        policies=[{"kind": active.kind, "params": active.params}],
        policy_ids=[active.pk],
        active_policy_id=active.pk,
        max_requests=10**300,
    )
    cell = job.cells.get()
    replay_cells.claim_cell(cell.pk, "w")
    replay_cells.finish_cell(cell.pk, result=RESULT)
    assert replay_tasks.replay_finish(job.pk) == "failed"
    job.refresh_from_db()
    assert job.state == "failed" and job.finished_at
    assert "could not be combined" in job.error and "DataError" in job.error


@pytest.mark.django_db
def test_a_running_job_whose_cells_all_ended_is_ended_by_the_sweep(cluster) -> None:
    job = _job(cluster)
    cell = job.cells.get()
    replay_cells.claim_cell(cell.pk, "w")
    ReplayCell.objects.filter(pk=cell.pk).update(state="succeeded", result=RESULT)
    assert replay_cells.finish_settled() == 1
    assert ReplayJob.objects.get(pk=job.pk).state == "succeeded"


@pytest.mark.django_db(transaction=True)
def test_a_cell_beats_its_heart_while_it_runs(cluster) -> None:
    job = _job(cluster)
    cell = job.cells.get()
    replay_cells.claim_cell(cell.pk, "w")
    long_ago = timezone.now() - timedelta(hours=1)
    ReplayCell.objects.filter(pk=cell.pk).update(heartbeat_at=long_ago)
    ReplayJob.objects.filter(pk=job.pk).update(heartbeat_at=long_ago)

    def beaten() -> bool:
        beat = ReplayJob.objects.get(pk=job.pk).heartbeat_at
        return beat is not None and beat > long_ago + timedelta(minutes=59)

    with replay_tasks._Heartbeat(cell.pk, every_s=0.05):  # no progress report meanwhile
        wait_until(beaten, 10, "a heartbeat")
    beats = [
        ReplayCell.objects.get(pk=cell.pk).heartbeat_at,
        ReplayJob.objects.get(pk=job.pk).heartbeat_at,
    ]
    assert all(beat is not None and beat > long_ago + timedelta(minutes=59) for beat in beats)
    assert replays.fail_abandoned(older_than_s=300) == 0


@pytest.mark.django_db
def test_a_trace_beyond_the_simulated_horizon_fails_its_cell_with_the_reason(
    cluster, traces
) -> None:
    rows = [
        {"chat_id": i + 1, "parent_chat_id": -1, "timestamp": t, "input_length": 64}
        | {"output_length": 4, "hash_ids": [i], "type": "text", "turn": 1}
        for i, t in enumerate((0, 1e8, 1e8 + 1))
    ]
    (traces / "far.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    job = _job(cluster, trace="shared:far.jsonl")
    assert replay_tasks.run_replay(job.pk) == "failed"
    job.refresh_from_db()
    assert "more than a replay simulates" in job.error and "rate scale" in job.error


@pytest.mark.django_db
def test_a_queued_job_is_not_sent_again_every_minute(cluster) -> None:
    job = _job(cluster, seeds=[0, 1])
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)

    def taken() -> list:
        messages = [
            m
            for m in client.lrange(queue_key("replays"), 0, -1)
            if json.loads(m)["headers"].get("task") == replays.CELL_TASK
        ]
        for message in messages:
            client.lrem(queue_key("replays"), 0, message)  # type: ignore[arg-type]  # stub: str
        return messages

    try:
        taken()
        assert replays.dispatch_job(job).dispatched
        first = taken()
        assert len(first) == 2
        assert all(json.loads(m)["headers"].get("chord") is None for m in first)
        ReplayJob.objects.filter(pk=job.pk).update(created_at=timezone.now() - timedelta(hours=2))
        assert replays.redispatch_stale(older_than_s=60) == 0  # sent a moment ago: waiting
        assert taken() == []
        replay_cells.claim_cell(job.cells.all()[0].pk, "w")  # one cell running
        ReplayJob.objects.filter(pk=job.pk).update(
            state="queued", heartbeat_at=timezone.now() - timedelta(hours=2)
        )
        assert replays.redispatch_stale(older_than_s=60) == 1
        assert len(taken()) == 1  # only the cell still queued
    finally:
        client.close()
