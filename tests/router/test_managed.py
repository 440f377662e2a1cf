"""Managed mode: the contract in config_source.py against a stand-in control plane (its
pub/sub and heartbeats), and a restarted router's last good config against the real one."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
import redis

from controlplane.models import RouterDeployment
from controlplane.services import clusters, config, policies, router_deployments
from devharness import free_port, stop_process, wait_until
from router_worker.contract.telemetry import CONFIG_CHANNEL
from tests.router.helpers import MODEL, launch_router, router_config
from tests.web.helpers import SYSTEM, start_asgi

TOKEN = "router-token-1"


class FakeControlPlane:
    def __init__(self) -> None:
        self.version = 1
        self.document: dict[str, Any] | None = None
        self.heartbeats: list[dict[str, Any]] = []
        self.unauthorised = 0
        plane = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.headers.get("authorization") != f"Bearer {TOKEN}":
                    plane.unauthorised += 1
                    return self._reply(401, {"detail": "bad token"})
                if self.path != "/api/v1/routers/dep-1/config" or plane.document is None:
                    return self._reply(404, {"detail": "none"})
                self._reply(200, {"version": plane.version, "document": plane.document})

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(length))
                if self.path == "/api/v1/routers/dep-1/heartbeat":
                    plane.heartbeats.append(body)
                self._reply(200, {"ok": True})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def control_plane() -> Iterator[FakeControlPlane]:
    plane = FakeControlPlane()
    yield plane
    plane.close()


def _policy(router) -> str:
    response = httpx.post(
        router.url + "/v1/completions", json={"model": MODEL, "prompt": "managed", "max_tokens": 1}
    )
    assert response.status_code == 200
    return response.headers["x-switchyard-policy"]


def test_managed_router_follows_the_control_plane(fleet, control_plane, private_redis, tmp_path):
    control_plane.document = router_config(fleet, "lmetric")
    args = (
        "--control-plane",
        control_plane.url,
        "--deployment",
        "dep-1",
        "--token",
        TOKEN,
        "--state-dir",
        str(tmp_path / "state"),
        "--poll-interval",
        "30",
        "--heartbeat-interval",
        "0.2",
    )
    router = launch_router(tmp_path, None, *args, redis_url=private_redis.url)
    try:
        assert _policy(router) == "lmetric"
        wait_until(
            lambda: any(h["applied_version"] == 1 for h in control_plane.heartbeats),
            10,
            "heartbeat with the applied version",
        )
        assert control_plane.unauthorised == 0
        # A new version announced on pub/sub is fetched at once (the poll is 30 s away).
        control_plane.document = router_config(fleet, "round_robin")
        control_plane.version = 2
        publisher = redis.Redis(port=private_redis.port)
        wait_until(
            lambda: (
                publisher.publish(CONFIG_CHANNEL, json.dumps({"cluster": "test", "version": 2})) > 0
                and _policy(router) == "round_robin"
            ),
            10,
            "version 2 applied",
        )
        publisher.close()
        wait_until(
            lambda: control_plane.heartbeats[-1]["applied_version"] == 2,
            10,
            "heartbeat reports version 2",
        )
        state = control_plane.heartbeats[-1]["state"]
        assert set(state["instances"]) == {"i0", "i1", "i2", "i3"}
    finally:
        router.stop()


@pytest.mark.django_db(transaction=True)
def test_a_restarted_router_serves_its_last_good_config_when_the_control_plane_is_gone(
    fleet, tmp_path
):
    """The real control plane (uvicorn on the test database) serves the router its
    config; then it is stopped, and a restarted router serves what it last applied."""
    cluster = clusters.create_cluster(SYSTEM, name="managed", model=MODEL, gpu_type="h20")
    for index, url in enumerate(fleet.urls()):
        clusters.add_instance(SYSTEM, cluster.pk, name=f"i{index}", url=url, reason="setup")
    chosen = policies.create_policy(SYSTEM, cluster.pk, name="rr", kind="round_robin")
    policies.activate_policy(SYSTEM, cluster.pk, chosen.pk, reason="setup")
    token, deployment = router_deployments.create_router_deployment(
        SYSTEM, cluster.pk, name="r-managed", host="127.0.0.1", port=free_port()
    )
    plane = start_asgi(free_port(), tmp_path / "uvicorn.log")
    args = (
        "--control-plane", plane.url,
        "--deployment", str(deployment.pk),
        "--token", token,
        "--state-dir", str(tmp_path / "state"),
        "--heartbeat-interval", "0.2",
    )  # fmt: skip
    latest = config.latest_version(cluster)
    assert latest is not None
    try:
        router = launch_router(tmp_path, None, *args)
        try:
            assert _policy(router) == "round_robin"
            wait_until(
                lambda: (
                    RouterDeployment.objects.get(pk=deployment.pk).applied_version == latest.number
                ),
                20,
                "the control plane to record the applied version",
            )
        finally:
            router.stop()
    finally:
        stop_process(plane.process)
    with pytest.raises(httpx.ConnectError):  # the control plane is gone
        httpx.get(plane.url + "/healthz", timeout=5)
    router = launch_router(tmp_path, None, *args)
    try:
        assert _policy(router) == "round_robin"
        assert "last good config" in router.log()
        applied = httpx.get(router.url + "/admin/config", headers=router.admin_headers).json()
        assert applied["version"] == latest.number and applied["cluster"] == "managed"
    finally:
        router.stop()


def test_managed_router_without_any_config_answers_503(control_plane, tmp_path):
    args = (
        "--control-plane",
        control_plane.url,
        "--deployment",
        "dep-1",
        "--token",
        TOKEN,
        "--state-dir",
        str(tmp_path / "empty"),
    )
    router = launch_router(tmp_path, None, *args, wait=False)
    try:
        wait_until(
            lambda: httpx.get(router.url + "/health").status_code == 503,
            60,  # a router process starting on a loaded machine
            "router up without config",
        )
        response = httpx.post(router.url + "/v1/completions", json={"model": MODEL, "prompt": "x"})
        assert response.status_code == 503 and response.json()["error"]["code"] == 503
    finally:
        router.stop()
