"""Starts and supervises the router processes assigned to this host.

Runs as a thread inside the host's Celery `routers` worker (see bootstep.py), never inside
a task: a router is a long-lived server, and a task that never returns would pin the
worker. Every `poll_s` it compares the deployments the database wants on this host with
the processes it has, starts what is missing, stops what is no longer wanted and restarts
what crashed with exponential backoff, recording each crash as a RouterEvent.

Routers never outlive their supervisor: each is started with `--supervisor-pid` (the router
then exits when this worker dies, even by SIGKILL or the OOM killer: see
router_worker/lifeline.py), and a pidfile per deployment lets a new supervisor stop a
leftover from a previous one before it starts the router again.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis
from django.conf import settings
from django.db import close_old_connections, connections

from controlplane.models import RouterDeployment
from controlplane.router_hosts import identity
from controlplane.router_hosts.environment import router_environment
from controlplane.services import supervision

log = logging.getLogger(__name__)
BACKOFF_INITIAL_S = 0.5
BACKOFF_MAX_S = 30.0
# A router that ran this long before exiting is restarted without backoff.
STABLE_AFTER_S = 60.0
# A router that answers no HTTP request on its port within this long is hung.
RESPONSIVE_TIMEOUT_S = 3.0
# How often the routers' Redis users are checked (and made again if Redis lost them).
REDIS_USERS_CHECK_S = 5.0


@dataclass
class RouterProcess:
    router_id: int
    process: subprocess.Popen
    started_at: float
    log_path: Path
    port: int = 0
    redis_identity: identity.RedisIdentity | None = None

    def alive(self) -> bool:
        return self.process.poll() is None

    def responsive(self) -> bool:
        """Alive and answering HTTP on its port (any status: 503 without config is fine)."""
        if not self.alive():
            return False
        try:
            httpx.get(
                f"http://127.0.0.1:{self.port}/health",
                timeout=RESPONSIVE_TIMEOUT_S,
                trust_env=False,
            )
        except httpx.HTTPError:
            return False
        return True

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
    pid_dir: Path | None = None  # default: log_dir
    processes: dict[int, RouterProcess] = field(default_factory=dict)
    backoff: dict[int, Backoff] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None
    _redis: redis.Redis | None = None
    _users_checked: float = 0.0

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.pid_dir = self.pid_dir or self.log_dir
        self.pid_dir.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._run, name="router-supervisor", daemon=True)
        self._thread.start()
        log.info("router supervisor for host %s started", self.host)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._lock:
            for running in self.processes.values():
                self._stop_process(running)
            self.processes.clear()
        if self._redis is not None:
            self._redis.close()

    def restart(self, router_id: int) -> bool:
        """Stop a router so the next pass starts it again (used for hung routers)."""
        with self._lock:
            running = self.processes.pop(router_id, None)
        if running is None:
            return False
        self._stop_process(running)
        supervision.record_router_exit(
            router_id, exit_code=running.process.returncode, restarting=True
        )
        return True

    def restart_if_unresponsive(self, router_id: int) -> bool:
        """Restart a router the control plane has not heard from, unless the process is up
        and answering: then the heartbeats were lost on the way, and restarting would only
        cut its streams. A dead process is restarted by the next pass anyway."""
        with self._lock:
            running = self.processes.get(router_id)
        if running is None or not running.alive():
            return False
        if running.responsive():
            log.info(
                "router %s is silent to the control plane but answers; left running", router_id
            )
            return False
        log.warning("router %s does not answer on port %d; restarting", router_id, running.port)
        return self.restart(router_id)

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
            router.pk: router
            for router in RouterDeployment.objects.filter(
                host=self.host, desired_state=RouterDeployment.Desired.RUNNING
            ).select_related("cluster")
        }
        with self._lock:
            for router_id in [r for r in self.processes if r not in wanted]:
                self._stop_process(self.processes[router_id])
                del self.processes[router_id]  # only once it has really stopped
            for router in wanted.values():
                self._ensure_running(router)
            self._check_redis_users()

    def _stop_process(self, running: RouterProcess) -> None:
        running.stop()
        self._pidfile(running.router_id).unlink(missing_ok=True)
        if running.redis_identity is not None:
            identity.delete_user(self._redis_client(), running.redis_identity)

    def _redis_client(self) -> redis.Redis:
        if self._redis is None:
            self._redis = redis.Redis.from_url(
                settings.REDIS_URL, socket_timeout=1.0, socket_connect_timeout=1.0
            )
        return self._redis

    def _check_redis_users(self) -> None:
        now = time.monotonic()
        if now - self._users_checked < REDIS_USERS_CHECK_S:
            return
        self._users_checked = now
        identities = [p.redis_identity for p in self.processes.values() if p.redis_identity]
        if identities:
            identity.ensure_users(self._redis_client(), identities)

    def _ensure_running(self, router: RouterDeployment) -> None:
        now = time.monotonic()
        running = self.processes.get(router.pk)
        if running is not None and running.alive():
            return
        backoff = self.backoff.setdefault(router.pk, Backoff())
        if running is not None:  # crashed
            del self.processes[router.pk]
            if running.redis_identity is not None:
                identity.delete_user(self._redis_client(), running.redis_identity)
            backoff.failed(now, now - running.started_at)
            supervision.record_router_exit(
                router.pk, exit_code=running.process.returncode, restarting=True
            )
            log.warning(
                "router %s exited with %s; restarting in %.1fs",
                router,
                running.process.returncode,
                backoff.delay_s,
            )
        if now < backoff.not_before:
            return
        self.processes[router.pk] = self._spawn(router)

    def _spawn(self, router: RouterDeployment) -> RouterProcess:
        token = supervision.issue_router_token(router.pk)
        redis_url, redis_identity = settings.REDIS_URL, None
        if settings.ROUTER_REDIS_ACL:
            redis_identity = identity.new_identity(router.pk, router.cluster.name, router.name)
            identity.ensure_user(self._redis_client(), redis_identity)
            redis_url = redis_identity.url(settings.REDIS_URL)
        env = router_environment(token, redis_url, identity.peer_keys(router.cluster_id))
        argv = [
            sys.executable,
            "-m",
            "router_worker",
            "--control-plane",
            self.control_plane_url,
            "--deployment",
            str(router.pk),
            "--port",
            str(router.port),
            "--name",
            router.name,
            # its last good config, where the demo's fresh start finds it (not the cwd's var/)
            "--state-dir",
            str(Path(settings.SWITCHYARD_VAR_DIR) / "router"),
        ]
        argv += ["--supervisor-pid", str(os.getpid())]
        if settings.ROUTER_NICE is not None:
            argv += ["--nice", str(settings.ROUTER_NICE)]
        self._stop_leftover(router.pk)
        log_path = self.log_dir / f"router-{router.name}.log"
        with log_path.open("ab") as log_file:
            # Same process group as the worker: a signal to the group (Ctrl-C, a service
            # manager) reaches the routers too; --supervisor-pid covers the worker's death.
            process = subprocess.Popen(
                argv, env=env, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        self._pidfile(router.pk).write_text(f"{process.pid}\n")
        log.info("started router %s (pid %d) on port %d", router, process.pid, router.port)
        return RouterProcess(
            router.pk, process, time.monotonic(), log_path, router.port, redis_identity
        )

    def _pidfile(self, router_id: int) -> Path:
        return (self.pid_dir or self.log_dir) / f"router-{router_id}.pid"

    def _stop_leftover(self, router_id: int) -> None:
        """Stop a router of this deployment left by an earlier supervisor (one that died
        before its routers could follow), so two never serve side by side."""
        try:
            pid = int(self._pidfile(router_id).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return
        if not is_router_process(pid, router_id):
            return  # gone, or the pid now belongs to something else
        log.warning("stopping leftover router %s (pid %d) before starting it again", router_id, pid)
        stop_pid(pid)


def is_router_process(pid: int, router_id: int) -> bool:
    """`pid` is a live router of deployment `router_id` (by its command line, so a reused
    pid is never mistaken for it)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return (
        b"router_worker" in argv
        and b"--deployment" in argv
        and argv[argv.index(b"--deployment") + 1 :][:1] == [str(router_id).encode()]
    )


def stop_pid(pid: int, grace_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after `grace_s` (the router finishes in-flight requests)."""
    try:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if not Path(f"/proc/{pid}").exists() or _zombie(pid):
                return
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


_current: RouterSupervisor | None = None


def current() -> RouterSupervisor | None:
    """The supervisor of this worker process, if it supervises routers."""
    return _current


def install(supervisor: RouterSupervisor | None) -> None:
    global _current
    _current = supervisor
