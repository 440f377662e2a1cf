"""Thin Celery tasks: each one calls a service or selector and returns a small result."""

from .maintenance import ping
from .replay import replay_cell, replay_finish
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
    "replay_cell",
    "replay_finish",
    "restart_router",
    "scrape_instances",
]
