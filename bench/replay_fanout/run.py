"""Replay fan-out on Celery: how much faster one replay job ends with more worker processes.

One job — four policies (lmetric, smetric, least_load, round_robin) at two loads (rate
scale 1 and 1.5) with two seeds, 16 cells, on the first ``--requests`` requests of the
Mooncake conversation trace, on a 16 × H20 Qwen2-7B cluster — is requested through the
control plane's replay service and run by a ``celery worker -Q replays,default -c N``
started for the purpose, for each N in ``--workers`` (1, 2, 4). The time is from the
request to the job's end (the chord's join), so it includes dispatch, claiming and the
join. The bench uses its own database (``switchyard_bench``, migrated here) and Redis
database 8, so a running ``make demo`` is not disturbed. It writes
``bench/replay_fanout/README.md``.

    .venv/bin/python -m bench.replay_fanout.run [--workers 1 --workers 2] [--requests 600]
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

DATABASE = "switchyard_bench"
os.environ.update(
    {
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",
        "SWITCHYARD_DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{DATABASE}",
        "SWITCHYARD_REDIS_URL": "redis://127.0.0.1:6379/8",
        "SWITCHYARD_SECRET_KEY": os.environ.get("SWITCHYARD_SECRET_KEY", "bench-only-secret-key"),
        "SWITCHYARD_TRACES_DIR": str(REPO.parent / "shared" / "traces"),
    }
)

TRACE = "mooncake_conversation_t0-2700s.jsonl"
POLICIES = ("lmetric", "smetric", "least_load", "round_robin")
REPORT = REPO / "bench" / "replay_fanout.md"


def ensure_database() -> None:
    import psycopg

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as db:
        exists = db.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone()
        if not exists:
            db.execute(f"CREATE DATABASE {DATABASE}")


def setup_cluster():  # -> Cluster
    from controlplane.models import Cluster
    from controlplane.services import clusters, policies
    from controlplane.services.audit import Actor

    actor = Actor.system("bench-fanout")
    name = f"fanout-{os.getpid()}"
    cluster = clusters.create_cluster(actor, name=name, model="qwen2-7b", gpu_type="h20")
    for index in range(16):
        clusters.add_instance(
            actor,
            cluster.pk,
            name=f"i{index:02d}",
            url=f"http://127.0.0.1:{9900 + index}",
            reason="bench",
        )
    for kind in POLICIES:
        policies.create_policy(actor, cluster.pk, name=kind.replace("_", "-"), kind=kind)
    return Cluster.objects.get(pk=cluster.pk)


def run_job(cluster, requests: int, workers: int, log: Path) -> dict:
    from controlplane.celery import app
    from controlplane.models import ReplayJob
    from controlplane.services import replays
    from controlplane.services.audit import Actor
    from devharness import control_plane as cp
    from devharness import start_process, stop_process, wait_until

    name = f"fanout-{workers}-{os.getpid()}"
    node = f"{name}@{socket.gethostname()}"
    args = cp.worker_command("replays,default", name, concurrency=workers, log_level="WARNING")
    process = start_process(args, cwd=REPO, env=dict(os.environ), log=log, stdin=None)
    try:
        wait_until(lambda: app.control.ping([node], timeout=1.0), 60, f"worker {node}")
        started = time.perf_counter()
        outcome = replays.request_replay(
            Actor.system("bench-fanout"),
            cluster.pk,
            trace=f"shared:{TRACE}",
            policies=[p.spec() for p in cluster.policies.order_by("name")],
            rate_scales=[1.0, 1.5],
            max_requests=requests,
            seeds=2,
        )
        job_id = outcome.job.pk

        def ended() -> bool:
            return ReplayJob.objects.get(pk=job_id).state in ("succeeded", "failed")

        wait_until(ended, 3600, f"replay {job_id}", interval=0.2)
        wall = time.perf_counter() - started
        job = ReplayJob.objects.get(pk=job_id)
        cells = list(job.cells.all())
        return {
            "workers": workers,
            "state": job.state,
            "cells": len(cells),
            "failed": sum(c.state == "failed" for c in cells),
            "wall_s": wall,
            "processes": len({c.worker for c in cells}),
        }
    finally:
        stop_process(process)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, action="append", help="default 1, 2, 4")
    parser.add_argument("--requests", type=int, default=600, help="requests of the trace")
    args = parser.parse_args()
    ensure_database()
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    cluster = setup_cluster()
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    load = os.getloadavg()[0]
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for workers in args.workers or [1, 2, 4]:
                row = run_job(cluster, args.requests, workers, Path(tmp) / f"w{workers}.log")
                rows.append(row)
                print(row, flush=True)
    finally:
        cluster.delete()
    base = rows[0]["wall_s"] if rows else 1.0
    lines = [
        "# Replay fan-out on Celery workers",
        "",
        f"Generated by `python -m bench.replay_fanout.run` on {machine} (load average "
        f"{load:.1f} at the start). One job: {len(POLICIES)} policies × 2 loads × 2 seeds = "
        f"16 cells, the first {args.requests} requests of `{TRACE}`, 16 × H20 Qwen2-7B; time "
        "from the request to the chord's join.",
        "",
        "| worker processes | cells | failed | processes that ran cells | wall (s) | speed-up |",
        "|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {r['workers']} | {r['cells']} | {r['failed']} | {r['processes']} | "
            f"{r['wall_s']:.1f} | {base / r['wall_s']:.2f}× |"
            for r in rows
        ),
        "",
    ]
    REPORT.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
