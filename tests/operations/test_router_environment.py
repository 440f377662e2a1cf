"""A router spawned by the routers worker gets only the environment it needs: the worker's
secrets (Django's secret key, the database URL with its password) stay in the worker."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from controlplane.models import Cluster, RouterDeployment
from controlplane.router_hosts import identity
from controlplane.router_hosts.supervisor import RouterSupervisor
from devharness import free_port, wait_until
from tests.operations.helpers import router_answers

pytestmark = pytest.mark.django_db(transaction=True)

DATABASE_URL = "postgres://switchyard:db-password-must-not-leak@127.0.0.1:5432/switchyard"


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {key.decode(): value.decode(errors="replace") for key, value in pairs}


def test_router_process_environment_is_an_allowlist(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SWITCHYARD_SECRET_KEY", "django-secret-must-not-leak")
    monkeypatch.setenv("SWITCHYARD_DATABASE_URL", DATABASE_URL)
    monkeypatch.setenv("PGPASSWORD", "db-password-must-not-leak")
    monkeypatch.setenv("SWITCHYARD_LOG_LEVEL", "DEBUG")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "router-under-test")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    cluster = Cluster.objects.create(name="env-test", model="m", gpu_type="h20")
    port = free_port()
    deployment = RouterDeployment.objects.create(
        cluster=cluster, name="r-env", host="env-host", port=port
    )
    supervisor = RouterSupervisor(
        host="env-host", control_plane_url="http://127.0.0.1:9", log_dir=tmp_path, poll_s=0.2
    )
    supervisor.start()
    try:
        running = wait_until(lambda: supervisor.processes.get(deployment.pk), 20, "router process")
        wait_until(lambda: router_answers(port), 20, "router up")
        environment = _environ(running.process.pid)
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 503
    finally:
        supervisor.stop()
    leaked = [
        name
        for name, value in environment.items()
        if "must-not-leak" in value
        or name in {"SWITCHYARD_DATABASE_URL", "PGPASSWORD", "SWITCHYARD_SECRET_KEY"}
    ]
    assert leaked == []
    assert environment["SWITCHYARD_ROUTER_TOKEN"].startswith("syr_")
    assert environment["SWITCHYARD_LOG_LEVEL"] == "DEBUG"  # the router's own settings pass
    assert environment["SWITCHYARD_REDIS_URL"]
    assert environment["OTEL_SERVICE_NAME"] == "router-under-test"  # tracing's own variables
    # the cluster's replica-sync key, derived per cluster (never the secret key itself)
    current, _ = identity.peer_keys(cluster.pk)
    assert environment["SWITCHYARD_PEER_KEY"] == current != identity.peer_keys(cluster.pk + 1)[0]
