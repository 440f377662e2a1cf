"""Starts and supervises the router processes assigned to this host.

Runs as a thread inside the host's Celery `routers` worker (see bootstep.py), never inside
a task: a router is a long-lived server, and a task that never returns would pin the
worker. Every `poll_s` it compares the deployments the database wants on this host with
the processes it has, starts what is missing, stops what is no longer wanted and restarts
what crashed with exponential backoff, recording each crash as a RouterEvent.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.db import close_old_connections, connections

from controlplane.models import RouterDeployment
from controlplane.routers.environment import router_environment
from controlplane.services import supervision

log = logging.getLogger(__name__)
BACKOFF_INITIAL_S = 0.5
BACKOFF_MAX_S = 30.0
# A router that ran this long before exiting is restarted without backoff.
STABLE_AFTER_S = 60.0


@dataclass
class RouterProcess:
    router_id: int
    process: subprocess.Popen
    started_at: float
    log_path: Path

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, grace_s: float = 5.0) -> None:
        if not self.alive():
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@dataclass
class Backoff:
    delay_s: float = 0.0
    not_before: float = 0.0

    def failed(self, now: float, ran_for_s: float) -> None:
        if ran_for_s >= STABLE_AFTER_S:
            self.delay_s = 0.0
        else:
            self.delay_s = min(BACKOFF_MAX_S, max(BACKOFF_INITIAL_S, self.delay_s * 2))
        self.not_before = now + self.delay_s


@dataclass
class RouterSupervisor:
    host: str
    control_plane_url: str
    log_dir: Path
    poll_s: float = 1.0
    processes: dict[int, RouterProcess] = field(default_factory=dict)
    backoff: dict[int, Backoff] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._run, name="router-supervisor", daemon=True)
        self._thread.start()
        log.info("router supervisor for host %s started", self.host)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._lock:
            for running in self.processes.values():
                running.stop()
            self.processes.clear()

    def restart(self, router_id: int) -> bool:
        """Stop a router so the next pass starts it again (used for hung routers)."""
        with self._lock:
            running = self.processes.pop(router_id, None)
        if running is None:
            return False
        running.stop()
        supervision.record_router_exit(router_id, exit_code=running.process.returncode,
                                       restarting=True)
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                close_old_connections()
                self.reconcile_once()
            except Exception:  # keep supervising through database hiccups
                log.exception("router supervisor pass failed; retrying")
            self._stop.wait(self.poll_s)
        connections.close_all()  # this thread's own connections

    def reconcile_once(self) -> None:
        wanted = {
            router.pk: router for router in RouterDeployment.objects.filter(
                host=self.host, desired_state=RouterDeployment.Desired.RUNNING)
        }
        with self._lock:
            for router_id in [r for r in self.processes if r not in wanted]:
                self.processes[router_id].stop()
                del self.processes[router_id]  # only once it has really stopped
            for router in wanted.values():
                self._ensure_running(router)

    def _ensure_running(self, router: RouterDeployment) -> None:
        now = time.monotonic()
        running = self.processes.get(router.pk)
        if running is not None and running.alive():
            return
        backoff = self.backoff.setdefault(router.pk, Backoff())
        if running is not None:  # crashed
            del self.processes[router.pk]
            backoff.failed(now, now - running.started_at)
            supervision.record_router_exit(router.pk, exit_code=running.process.returncode,
                                           restarting=True)
            log.warning("router %s exited with %s; restarting in %.1fs", router,
                        running.process.returncode, backoff.delay_s)
        if now < backoff.not_before:
            return
        self.processes[router.pk] = self._spawn(router)

    def _spawn(self, router: RouterDeployment) -> RouterProcess:
        token = supervision.issue_router_token(router.pk)
        env = router_environment(token, settings.REDIS_URL)
        argv = [sys.executable, "-m", "router_worker",
                "--control-plane", self.control_plane_url, "--deployment", str(router.pk),
                "--port", str(router.port), "--name", router.name]
        log_path = self.log_dir / f"router-{router.name}.log"
        with log_path.open("ab") as log_file:
            process = subprocess.Popen(argv, env=env, stdout=log_file, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL)  # same group: dies with the worker
        log.info("started router %s (pid %d) on port %d", router, process.pid, router.port)
        return RouterProcess(router.pk, process, time.monotonic(), log_path)


_current: RouterSupervisor | None = None


def current() -> RouterSupervisor | None:
    """The supervisor of this worker process, if it supervises routers."""
    return _current


def install(supervisor: RouterSupervisor | None) -> None:
    global _current
    _current = supervisor
