"""Router supervision under faults: a router that is silent to the control plane but still
answers is not restarted; a hung one is; routers exit with their supervisor; a leftover
from a dead supervisor is stopped before the router starts again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from controlplane.models import Cluster, RouterDeployment
from controlplane.router_hosts import supervisor as supervisor_module
from controlplane.router_hosts.supervisor import RouterSupervisor
from controlplane.tasks.routing import restart_router
from devharness import free_port, start_process, wait_until
from tests.operations.helpers import router_answers

pytestmark = pytest.mark.django_db(transaction=True)
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def supervisor(tmp_path: Path):
    running = RouterSupervisor(
        host="life-host",
        control_plane_url="http://127.0.0.1:9",
        log_dir=tmp_path / "log",
        pid_dir=tmp_path / "run",
        poll_s=0.2,
    )
    running.start()
    supervisor_module.install(running)
    yield running
    supervisor_module.install(None)
    running.stop()


def deployment(port: int) -> RouterDeployment:
    cluster = Cluster.objects.create(name="life", model="m", gpu_type="h20")
    return RouterDeployment.objects.create(cluster=cluster, name="r0", host="life-host", port=port)


def started(supervisor: RouterSupervisor, router: RouterDeployment):
    running = wait_until(lambda: supervisor.processes.get(router.pk), 20, "router process")
    wait_until(lambda: router_answers(router.port), 20, "router up")
    return running


def test_a_router_that_answers_is_not_restarted_for_silence(supervisor):
    router = deployment(free_port())
    first = started(supervisor, router)
    assert restart_router(router.pk) is False  # its heartbeats were lost, it is fine
    assert supervisor.processes[router.pk] is first and first.alive()
    assert RouterDeployment.objects.get(pk=router.pk).restarts == 0


def test_a_hung_router_is_restarted(supervisor):
    router = deployment(free_port())
    first = started(supervisor, router)
    os.kill(first.process.pid, signal.SIGSTOP)
    try:
        assert restart_router(router.pk) is True
    finally:
        if first.process.poll() is None:
            os.kill(first.process.pid, signal.SIGCONT)
    assert first.process.poll() is not None
    second = wait_until(
        lambda: (
            (p := supervisor.processes.get(router.pk)) and p.process.pid != first.process.pid and p
        ),
        20,
        "router process",
    )
    wait_until(lambda: router_answers(router.port), 20, "router up")
    assert second.alive()


def _spawn_parent(port: int, tmp_path: Path) -> tuple[subprocess.Popen, int]:
    """A stand-in supervisor process that starts one router with --supervisor-pid and
    prints the router's pid."""
    script = (
        "import os, subprocess, sys, time\n"
        "argv = [sys.executable, '-m', 'router_worker', '--control-plane',"
        " 'http://127.0.0.1:9', '--deployment', '1', '--token', 't', '--port',"
        f" '{port}', '--state-dir', {str(tmp_path)!r},"
        " '--supervisor-pid', str(os.getpid())]\n"
        "child = subprocess.Popen(argv, stdout=subprocess.DEVNULL,"
        " stderr=open(os.path.join(" + repr(str(tmp_path)) + ", 'router.log'), 'ab'))\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = start_process(
        [sys.executable, "-c", script],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=None,
        stdin=None,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert parent.stdout is not None  # stdout=PIPE
    return parent, int(parent.stdout.readline())


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_router_exits_when_its_supervisor_is_killed(tmp_path):
    port = free_port()
    parent, router_pid = _spawn_parent(port, tmp_path)
    try:
        wait_until(lambda: router_answers(port), 20, "router up")
        parent.kill()  # SIGKILL: the parent gets no chance to stop its child
        parent.wait()
        wait_until(lambda: _gone(router_pid), 30, "the old router to exit")
        assert not router_answers(port)
    finally:
        parent.kill()
        if not _gone(router_pid):
            os.kill(router_pid, signal.SIGKILL)


def _leftover(router: RouterDeployment, tmp_path: Path) -> subprocess.Popen:
    """A router of this deployment that no supervisor owns (a previous one died)."""
    argv = [
        sys.executable,
        "-m",
        "router_worker",
        "--control-plane",
        "http://127.0.0.1:9",
        "--deployment",
        str(router.pk),
        "--token",
        "old",
        "--port",
        str(router.port),
        "--state-dir",
        str(tmp_path),
    ]
    process = start_process(argv, cwd=REPO, stdin=None, env={**os.environ, "PYTHONPATH": str(REPO)})
    (tmp_path / "run").mkdir(exist_ok=True)
    (tmp_path / "run" / f"router-{router.pk}.pid").write_text(f"{process.pid}\n")
    return process


def test_a_leftover_router_is_stopped_before_the_router_starts_again(tmp_path):
    router = deployment(free_port())
    RouterDeployment.objects.filter(pk=router.pk).update(desired_state="stopped")
    leftover = _leftover(router, tmp_path)
    running = RouterSupervisor(
        host="life-host",
        control_plane_url="http://127.0.0.1:9",
        log_dir=tmp_path / "log",
        pid_dir=tmp_path / "run",
        poll_s=0.2,
    )
    try:
        wait_until(lambda: router_answers(router.port), 20, "router up")
        running.start()
        RouterDeployment.objects.filter(pk=router.pk).update(desired_state="running")
        fresh = wait_until(lambda: running.processes.get(router.pk), 20, "router process")
        wait_until(lambda: leftover.poll() is not None, 30, "the old router to exit")
        wait_until(lambda: router_answers(router.port), 20, "router up")
        assert fresh.alive() and fresh.process.pid != leftover.pid
    finally:
        running.stop()
        if leftover.poll() is None:
            leftover.kill()
        leftover.wait()
