"""Thin Celery tasks: each one calls a service or selector and returns a small result."""

from .maintenance import ping
from .replay import run_replay
from .routing import (
    ingest_captures,
    ingest_events,
    ingest_metrics,
    judge_canaries,
    prune,
    reconcile_all,
    restart_router,
    scrape_instances,
)

__all__ = [
    "ingest_captures",
    "ingest_events",
    "ingest_metrics",
    "judge_canaries",
    "ping",
    "prune",
    "reconcile_all",
    "restart_router",
    "run_replay",
    "scrape_instances",
]
