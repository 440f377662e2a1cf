"""The routers worker's supervisor runs real router processes and restarts crashed ones."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import httpx
import pytest

from controlplane.models import Cluster, RouterDeployment, RouterEvent
from controlplane.router_fleet.supervisor import RouterSupervisor

pytestmark = pytest.mark.django_db(transaction=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(predicate, timeout_s: float = 20.0, interval_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"condition not met within {timeout_s}s")


def router_answers(port: int) -> bool:
    """The router's HTTP server is up (503 is fine: it has no config from the control plane
    in this test, and says so)."""
    try:
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
    except httpx.HTTPError:
        return False
    return True


@pytest.fixture
def supervisor(tmp_path: Path):
    running = RouterSupervisor(host="test-host", control_plane_url="http://127.0.0.1:9",
                               log_dir=tmp_path, poll_s=0.2)
    running.start()
    yield running
    running.stop()


def test_router_is_started_restarted_after_a_crash_and_stopped_when_unwanted(supervisor):
    cluster = Cluster.objects.create(name="sup", model="m", gpu_type="h20")
    port = free_port()
    deployment = RouterDeployment.objects.create(cluster=cluster, name="r0", host="test-host",
                                                 port=port)
    RouterDeployment.objects.create(cluster=cluster, name="elsewhere", host="other-host",
                                    port=free_port())
    first = wait_until(lambda: supervisor.processes.get(deployment.pk))
    wait_until(lambda: router_answers(port))
    assert set(supervisor.processes) == {deployment.pk}  # only this host's deployments
    assert deployment.pk and RouterDeployment.objects.get(pk=deployment.pk).token_hash

    os.kill(first.process.pid, signal.SIGKILL)
    second = wait_until(lambda: (p := supervisor.processes.get(deployment.pk))
                        and p.process.pid != first.process.pid and p)
    wait_until(lambda: router_answers(port))
    event = RouterEvent.objects.get(kind="router_restarted")
    assert event.payload["exit_code"] == -signal.SIGKILL
    assert RouterDeployment.objects.get(pk=deployment.pk).restarts == 1

    RouterDeployment.objects.filter(pk=deployment.pk).update(desired_state="stopped")
    wait_until(lambda: deployment.pk not in supervisor.processes)
    assert second.process.poll() is not None
