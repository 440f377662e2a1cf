"""The Celery application of the control plane.

Reliability choices, deliberately:
- prefetch 1: a worker holds at most one unstarted task, so a slow task never strands a
  backlog behind it on one worker while another idles;
- `acks_late` stays off by default: a task that dies mid-way is redelivered only when it is
  marked idempotent (`acks_late=True` on the task itself, with `reject_on_worker_lost`);
- soft/hard time limits on every task so a wedged task cannot pin a worker forever;
- broker connection retried on start-up so a worker started before Redis waits for it.
"""

from __future__ import annotations

import os

from celery import Celery
from click import Option

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

app = Celery("switchyard")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.update(
    worker_prefetch_multiplier=1,
    task_acks_late=False,
    task_reject_on_worker_lost=False,
    task_soft_time_limit=60,
    task_time_limit=90,
    broker_connection_retry_on_startup=True,
    broker_connection_max_retries=None,
    result_expires=3600,
    task_default_queue="default",
    task_track_started=True,
    worker_hijack_root_logger=False,
    timezone="UTC",
)
app.conf.beat_schedule = {
    "reconcile": {"task": "switchyard.reconcile", "schedule": 5.0},
    "scrape-instances": {"task": "switchyard.scrape_instances", "schedule": 5.0},
    "ingest-events": {"task": "switchyard.ingest_events", "schedule": 1.0},
    "ingest-metrics": {"task": "switchyard.ingest_metrics", "schedule": 2.0},
    "ingest-captures": {"task": "switchyard.ingest_captures", "schedule": 2.0},
    "judge-canaries": {"task": "switchyard.judge_canaries", "schedule": 10.0},
    "prune": {"task": "switchyard.prune", "schedule": 3600.0},
    "redispatch-replays": {"task": "switchyard.redispatch_replays", "schedule": 60.0},
    "prune-uploads": {"task": "switchyard.prune_uploads", "schedule": 3600.0},
}
app.conf.task_routes = {
    # restart_router is sent explicitly to the router host's queue (routers.<host>).
    # Replays run for minutes: on their own queue and worker, so that ingest, scrapes,
    # reconcile and the canary judge (its rollbacks) never wait behind one.
    "switchyard.replay_cell": {"queue": "replays"},
}
app.autodiscover_tasks(["controlplane"], related_name="tasks")

app.user_options["worker"].add(
    Option(
        ["--supervise-routers"],
        is_flag=True,
        default=False,
        help="Start and supervise this host's router processes (routers queue worker).",
    )
)


def _install_router_bootstep() -> None:
    from controlplane.router_hosts.bootstep import RouterSupervisorStep

    app.steps["worker"].add(RouterSupervisorStep)


_install_router_bootstep()
