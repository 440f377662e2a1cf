"""A replay job fanned out on real Celery workers: one task per policy, load and seed on
the ``replays`` queue, joined by a chord; a cell that keeps failing is retried, then
reported with its reason, and the others' results are kept."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from controlplane.celery import app as celery_app
from controlplane.models import ReplayCell, ReplayJob
from controlplane.services import replay_cells, replays
from devharness import control_plane as cp
from devharness import free_port, stop_process, wait_until
from devharness import start_process as harness_start

from .helpers import ROOT, TRACE, subprocess_env

pytestmark = [pytest.mark.celery_worker, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def replay_worker(traces, tmp_path):
    """A replays worker (and default queue, for the chord's join) with two processes."""
    name = f"chord-{free_port()}"
    node = f"{name}@{socket.gethostname()}"
    args = cp.worker_command("replays,default", name, concurrency=2, log_level="WARNING")
    # tasks earlier tests of this worker left on these queues (dispatched with no worker to
    # take them) would otherwise run first, against rows those tests no longer hold
    with celery_app.connection_for_write() as connection:
        for queue in ("replays", "default"):
            connection.default_channel.queue_purge(queue)
    log = tmp_path / "worker.log"
    process = harness_start(args, cwd=ROOT, env=subprocess_env(), log=log, stdin=None)
    yield log, node
    stop_process(process)


def test_cells_run_on_the_workers_and_the_chord_joins_them(
    cluster, replay_worker: tuple[Path, str]
):
    log, node = replay_worker
    inputs = {
        "trace": f"shared:{TRACE}",
        "policies": [p.spec() for p in cluster.policies.order_by("name")],
        "rate_scales": [1.0, 1.5],
        "seeds": [0, 1],
        "max_requests": 40,
    }
    job = ReplayJob.objects.create(cluster=cluster, inputs=inputs)
    cells = replay_cells.create_cells(job)
    assert len(cells) == 8  # 2 policies × 2 loads × 2 seeds
    # a cell no retry can mend (its policy index names no policy)
    broken = ReplayCell.objects.create(job=job, index=8, policy=9, rate_scale=1.0, seed=0)
    assert replays.dispatch_job(job).dispatched

    def ended() -> bool:
        job.refresh_from_db()
        return job.state in ("succeeded", "failed")

    wait_until(ended, 120, "the job to end", log=log)
    assert job.state == "succeeded", job.error
    assert job.results is not None
    rows = job.results["policies"]
    assert [(r["kind"], r["rate_scale"], r["seeds"]) for r in rows] == [
        ("lmetric", 1.0, 2),
        ("lmetric", 1.5, 2),
        ("round_robin", 1.0, 2),
        ("round_robin", 1.5, 2),
    ]
    assert all(r["ci"]["ttft_mean_s"] is not None for r in rows)
    broken.refresh_from_db()
    assert broken.state == "failed" and broken.attempts == 3
    assert "IndexError" in broken.error and "tried 3×" in broken.error
    assert job.results["failed_cells"] == [
        {"policy": 9, "rate_scale": 1.0, "seed": 0, "error": broken.error}
    ]
    # every cell, the broken one's retries included, was claimed by this test's worker
    # (each records the worker's node name and the pid of the process that ran it)
    workers = list(ReplayCell.objects.filter(job=job).values_list("worker", flat=True))
    assert len(workers) == 9
    assert all(w.startswith(f"{node} pid ") for w in workers), workers
