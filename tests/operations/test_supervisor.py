"""The routers worker's supervisor runs real router processes and restarts crashed ones."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from controlplane.models import Cluster, RouterDeployment, RouterEvent
from controlplane.router_hosts.supervisor import RouterSupervisor
from devharness import free_port, wait_until
from tests.operations.helpers import router_answers

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
