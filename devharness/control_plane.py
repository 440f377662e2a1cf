"""The control plane's processes, as the demo, the drills and the web tests start them: one
place that says how each is run.

* ``web``: the ASGI application (pages, API, websockets) under uvicorn;
* ``publisher``: the live view's telemetry publisher (``manage.py run_publisher``);
* ``worker``: a Celery worker on ``queues`` (``default``: ingest, rollups, scraping, the
  canary judge; ``replays``: what-if replays; ``routers,routers.<host>`` with
  ``supervise_routers``: a router host's worker, which starts and supervises its routers);
* ``beat``: Celery beat, the periodic tasks.

Each function returns the command line; the caller starts it (``devharness.start_process``,
``ManagedProcess`` or the demo's own supervision) in the repository's root, with its
database and Redis in the environment.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def web_command(port: int, host: str = "127.0.0.1", log_level: str = "warning") -> list[str]:
    """The control plane's ASGI application; ready when ``/healthz`` answers."""
    return [
        *_tool("uvicorn"),
        "controlplane.asgi:application",
        "--host",
        host,
        "--port",
        str(port),
        "--log-level",
        log_level,
        "--no-access-log",
    ]


def publisher_command() -> list[str]:
    """The telemetry publisher: routers' state from Redis to the live view's groups."""
    return [sys.executable, str(REPO / "manage.py"), "run_publisher"]


def worker_command(
    queues: str,
    name: str,
    *,
    concurrency: int = 1,
    solo: bool = False,
    supervise_routers: bool = False,
    beat_schedule: Path | None = None,
    log_level: str = "INFO",
) -> list[str]:
    """A Celery worker consuming ``queues`` (comma-separated), named ``name@%h``.
    ``beat_schedule``: run beat inside it too (one process for a small stack)."""
    argv = [*_celery(), "worker", "-Q", queues, "-n", f"{name}@%h", "--loglevel", log_level]
    argv += ["-P", "solo"] if solo else ["-c", str(concurrency)]
    if supervise_routers:
        argv.append("--supervise-routers")
    if beat_schedule is not None:
        argv += ["-B", "-s", str(beat_schedule)]
    return argv


def beat_command(schedule: Path, log_level: str = "INFO") -> list[str]:
    """Celery beat (reconcile, scrapes, ingest, rollups, the judge's rounds)."""
    return [*_celery(), "beat", "--loglevel", log_level, "-s", str(schedule)]


def routers_queues(host: str) -> str:
    """The queues of a router host's worker: every host's, and its own."""
    return f"routers,routers.{host}"


def _celery() -> list[str]:
    return [*_tool("celery"), "-A", "controlplane"]


def _tool(name: str) -> list[str]:
    """A console script of this environment, run as a module when it has no script here."""
    script = BIN / name
    return [str(script)] if script.exists() else [sys.executable, "-m", name]
