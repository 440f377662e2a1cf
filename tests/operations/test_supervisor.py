"""The routers worker's supervisor runs real router processes and restarts crashed ones."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import redis

from controlplane.models import Cluster, RouterDeployment, RouterEvent
from controlplane.router_hosts.supervisor import RouterSupervisor
from devharness import free_port, wait_until
from tests.operations.helpers import router_answers
from tests.router.helpers import private_redis_server

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def supervisor(tmp_path: Path):
    running = RouterSupervisor(
        host="test-host", control_plane_url="http://127.0.0.1:9", log_dir=tmp_path, poll_s=0.2
    )
    running.start()
    yield running
    running.stop()


def test_router_is_started_restarted_after_a_crash_and_stopped_when_unwanted(supervisor):
    cluster = Cluster.objects.create(name="sup", model="m", gpu_type="h20")
    port = free_port()
    deployment = RouterDeployment.objects.create(
        cluster=cluster, name="r0", host="test-host", port=port
    )
    RouterDeployment.objects.create(
        cluster=cluster, name="elsewhere", host="other-host", port=free_port()
    )
    first = wait_until(lambda: supervisor.processes.get(deployment.pk), 20, "router process")
    wait_until(lambda: router_answers(port), 20, "router up")
    assert set(supervisor.processes) == {deployment.pk}  # only this host's deployments
    assert deployment.pk and RouterDeployment.objects.get(pk=deployment.pk).token_hash

    os.kill(first.process.pid, signal.SIGKILL)
    second = wait_until(
        lambda: (
            (p := supervisor.processes.get(deployment.pk))
            and p.process.pid != first.process.pid
            and p
        ),
        20,
        "router process",
    )
    wait_until(lambda: router_answers(port), 20, "router up")
    event = RouterEvent.objects.get(kind="router_restarted")
    assert event.payload["exit_code"] == -signal.SIGKILL
    assert RouterDeployment.objects.get(pk=deployment.pk).restarts == 1

    RouterDeployment.objects.filter(pk=deployment.pk).update(desired_state="stopped")
    wait_until(lambda: deployment.pk not in supervisor.processes, 20, "the router to be stopped")
    assert second.process.poll() is not None


def test_routers_run_at_the_configured_niceness(supervisor, settings):
    settings.ROUTER_NICE = 3  # SWITCHYARD_ROUTER_NICE
    cluster = Cluster.objects.create(name="nice", model="m", gpu_type="h20")
    deployment = RouterDeployment.objects.create(
        cluster=cluster, name="r0", host="test-host", port=free_port()
    )
    running = wait_until(lambda: supervisor.processes.get(deployment.pk), 20, "router process")
    wait_until(lambda: router_answers(deployment.port), 20, "router up")
    tasks = Path(f"/proc/{running.process.pid}/task").iterdir()
    nices = {int((t / "stat").read_text().rsplit(")", 1)[1].split()[16]) for t in tasks}
    assert nices == {3}


class Clock:
    """The supervisor's monotonic clock, moved by the test: each pass is one ``poll_s``."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def test_a_routers_redis_user_is_remade_within_5_s_and_deleted_when_it_stops(
    tmp_path: Path, settings, monkeypatch
):
    """The README: each supervised router gets a Redis ACL user of its own, remade within
    5 s if Redis loses it and deleted when the router stops (a private redis-server)."""
    from controlplane.router_hosts import supervisor as module

    clock = Clock()
    monkeypatch.setattr(module, "time", clock)
    with private_redis_server("sy-acl-users-") as server:
        settings.REDIS_URL = server.url
        settings.ROUTER_REDIS_ACL = True
        admin = redis.Redis(port=server.port)
        running = RouterSupervisor(
            host="acl-host",
            control_plane_url="http://127.0.0.1:9",
            log_dir=tmp_path,
            pid_dir=tmp_path,
        )  # its passes are made here, one per poll_s of the clock: no thread

        def present(username: str) -> bool:
            return admin.execute_command("ACL", "GETUSER", username) is not None

        def next_pass() -> None:
            clock.now += running.poll_s
            running.reconcile_once()

        try:
            cluster = Cluster.objects.create(name="acl", model="m", gpu_type="h20")
            deployment = RouterDeployment.objects.create(
                cluster=cluster, name="r0", host="acl-host", port=free_port()
            )
            running.reconcile_once()
            user = running.processes[deployment.pk].redis_identity
            assert user is not None and present(user.username)
            wait_until(lambda: router_answers(deployment.port), 20, "router up")
            # lost right after the pass that checked the users: the longest wait there is
            admin.execute_command("ACL", "DELUSER", user.username)
            lost_at = clock.now
            while not present(user.username):
                assert clock.now - lost_at < 5.0, "the user was not remade within 5 s"
                next_pass()
            assert clock.now - lost_at <= 5.0
            assert running.processes[deployment.pk].redis_identity is user  # same password

            RouterDeployment.objects.filter(pk=deployment.pk).update(desired_state="stopped")
            next_pass()
            assert deployment.pk not in running.processes and not present(user.username)
        finally:
            running.stop()
            admin.close()
