"""Real processes for the end-to-end browser tests: an enginesim fleet, routers in managed
mode fetching their configuration from the control plane, the ASGI app and the publisher."""

from __future__ import annotations

import random
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis
from django.conf import settings

from controlplane.models import Cluster
from controlplane.services import router_deployments as router_service
from router_worker.telemetry_contract import loads_state, state_key

from .conftest import ROOT, SYSTEM, free_port, start_process, stop

MODEL = "Qwen/Qwen2-7B-Instruct"
ADMIN_TOKEN = "web-tests-admin-token"
TIME_SCALE = 0.05


def wait_for(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            result = check()
        except (httpx.HTTPError, redis.RedisError, ValueError):
            result = None
        if result:
            return result
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@dataclass
class Fleet:
    process: subprocess.Popen
    base_port: int
    size: int

    def url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.base_port + index}"


def start_fleet(size: int, log: Path, attempts: int = 3) -> Fleet:
    """enginesim instances on consecutive free ports (retried: other suites on this machine
    pick ports too)."""
    for attempt in range(attempts):
        try:
            return _try_fleet(size, log)
        except AssertionError:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def _try_fleet(size: int, log: Path) -> Fleet:
    base = _free_range(size)
    process = subprocess.Popen(
        [sys.executable, "-m", "enginesim", "serve", "--instances", str(size),
         "--base-port", str(base), "--gpu", "h20", "--model", "qwen2-7b",
         "--time-scale", str(TIME_SCALE)],
        cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    fleet = Fleet(process, base, size)

    def healthy(k: int) -> bool:
        if process.poll() is not None:
            raise AssertionError("enginesim exited")
        return httpx.get(fleet.url(k) + "/health", timeout=1).is_success

    try:
        for k in range(size):
            wait_for(lambda k=k: healthy(k), 30, "enginesim")
    except AssertionError as error:
        stop(process)
        raise AssertionError(f"{error}\n{log.read_text(errors='replace')[-2000:]}") from None
    return fleet


def _free_range(size: int) -> int:
    for _ in range(100):
        base = random.randrange(20_000, 40_000)
        if all(_bindable(base + k) for k in range(size)):
            return base
    raise AssertionError("no free port range")


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass
class RouterProcess:
    name: str
    port: int
    process: subprocess.Popen
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def admin_state(self) -> dict[str, Any]:
        response = httpx.get(f"{self.url}/admin/state", timeout=5,
                             headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        response.raise_for_status()
        return response.json()


def start_router(cluster: Cluster, name: str, control_plane: str, directory: Path
                 ) -> RouterProcess:
    """A router in managed mode: configuration from the control plane's API, versions
    announced on Redis pub/sub, heartbeats back."""
    port = free_port()
    token, deployment = router_service.create_router_deployment(
        SYSTEM, cluster.pk, name=name, host="127.0.0.1", port=port)
    log = directory / f"router-{name}.log"
    args = [sys.executable, "-m", "router_worker", "--port", str(port), "--name", name,
            "--admin-token", ADMIN_TOKEN, "--redis-url", settings.REDIS_URL,
            "--log-level", "WARNING", "--control-plane", control_plane,
            "--deployment", str(deployment.pk), "--token", token,
            "--state-dir", str(directory / f"state-{name}"), "--poll-interval", "2",
            "--heartbeat-interval", "1"]
    return RouterProcess(name, port, start_process(args, log), log)


@dataclass
class Stack:
    cluster: Cluster
    routers: list[RouterProcess]
    redis: redis.Redis
    processes: list[subprocess.Popen] = field(default_factory=list)

    def reported_versions(self) -> dict[str, int | None]:
        versions = {}
        for router in self.routers:
            raw = self.redis.get(state_key(self.cluster.name, router.name))
            versions[router.name] = loads_state(raw).config_version if raw else None
        return versions

    def wait_reporting(self, version: int, timeout: float = 30) -> None:
        try:
            wait_for(lambda: set(self.reported_versions().values()) == {version}, timeout,
                     f"every router to report config v{version}")
        except AssertionError as error:
            raise AssertionError(f"{error}: {self.reported_versions()}\n"
                                 f"{describe_logs(self)}") from None

    def close(self) -> None:
        for process in [r.process for r in self.routers] + self.processes:
            stop(process)


def chat(router_url: str, text: str, max_tokens: int = 8, timeout: float = 30,
         stream: bool = False) -> httpx.Response:
    """One chat completion through a router; streamed ones are read to the end (the router
    measures TTFT and TPOT on streams)."""
    body = {"model": MODEL, "max_tokens": max_tokens, "stream": stream,
            "messages": [{"role": "user", "content": text}]}
    with httpx.stream("POST", f"{router_url}/v1/chat/completions", json=body,
                      timeout=timeout) as response:
        response.read()
    response.raise_for_status()
    return response


def publisher_args() -> list[str]:
    return [sys.executable, "manage.py", "run_publisher"]


def describe_logs(stack: Stack) -> str:
    return "\n".join(f"--- {r.name}\n{r.log.read_text(errors='replace')[-2000:]}"
                     for r in stack.routers)

