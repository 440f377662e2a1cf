"""Real processes for the end-to-end browser tests: an enginesim fleet, routers in managed
mode fetching their configuration from the control plane, the ASGI app and the publisher."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis
from django.conf import settings

from controlplane.models import Cluster
from controlplane.services import router_deployments as router_service
from devharness import (
    TRANSIENT,
    ProcessExited,
    WaitTimeout,
    free_port,
    free_ports,
    stop_process,
    wait_http,
    wait_until,
)
from devharness import start_process as harness_start
from router_worker.telemetry_contract import loads_state, state_key

from .conftest import ROOT, SYSTEM, start_process

MODEL = "Qwen/Qwen2-7B-Instruct"
ADMIN_TOKEN = "web-tests-admin-token"
TIME_SCALE = 0.05


# Probes that fail while a stack is still coming up: not yet, rather than wrong.
STARTING = (*TRANSIENT, redis.RedisError, ValueError)


def wait_for(check: Callable[[], Any], timeout: float, what: str) -> Any:
    return wait_until(check, timeout, what, ignore=STARTING, interval=0.1)


@dataclass
class Fleet:
    process: subprocess.Popen
    base_port: int
    size: int

    def url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.base_port + index}"


def start_fleet(size: int, log: Path, attempts: int = 3, time_scale: float = TIME_SCALE) -> Fleet:
    """enginesim instances on consecutive free ports (retried: other suites on this machine
    pick ports too)."""
    for attempt in range(attempts):
        try:
            return _try_fleet(size, log, time_scale)
        except (WaitTimeout, ProcessExited):
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def _try_fleet(size: int, log: Path, time_scale: float) -> Fleet:
    base = free_ports(size)
    process = harness_start(
        [
            sys.executable,
            "-m",
            "enginesim",
            "serve",
            "--instances",
            str(size),
            "--base-port",
            str(base),
            "--gpu",
            "h20",
            "--model",
            "qwen2-7b",
            "--time-scale",
            str(time_scale),
        ],
        cwd=ROOT,
        log=log,
        stdin=None,
    )
    fleet = Fleet(process, base, size)
    try:
        for k in range(size):
            wait_http(
                fleet.url(k) + "/health",
                30,
                process=process,
                log=log,
                ok=lambda status: 200 <= status < 300,
            )
    except BaseException:
        stop_process(process)
        raise
    return fleet


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
        response = httpx.get(
            f"{self.url}/admin/state", timeout=5, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        )
        response.raise_for_status()
        return response.json()


def start_router(cluster: Cluster, name: str, control_plane: str, directory: Path) -> RouterProcess:
    """A router in managed mode: configuration from the control plane's API, versions
    announced on Redis pub/sub, heartbeats back."""
    port = free_port()
    token, deployment = router_service.create_router_deployment(
        SYSTEM, cluster.pk, name=name, host="127.0.0.1", port=port
    )
    log = directory / f"router-{name}.log"
    args = [
        sys.executable,
        "-m",
        "router_worker",
        "--port",
        str(port),
        "--name",
        name,
        "--admin-token",
        ADMIN_TOKEN,
        "--redis-url",
        settings.REDIS_URL,
        "--log-level",
        "WARNING",
        "--control-plane",
        control_plane,
        "--deployment",
        str(deployment.pk),
        "--token",
        token,
        "--state-dir",
        str(directory / f"state-{name}"),
        "--poll-interval",
        "2",
        "--heartbeat-interval",
        "1",
    ]
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
            wait_for(
                lambda: set(self.reported_versions().values()) == {version},
                timeout,
                f"every router to report config v{version}",
            )
        except AssertionError as error:
            raise AssertionError(
                f"{error}: {self.reported_versions()}\n{describe_logs(self)}"
            ) from None

    def close(self) -> None:
        for process in [r.process for r in self.routers] + self.processes:
            stop_process(process)


def chat(
    router_url: str, text: str, max_tokens: int = 8, timeout: float = 30, stream: bool = False
) -> httpx.Response:
    """One chat completion through a router; streamed ones are read to the end (the router
    measures TTFT and TPOT on streams)."""
    body = {
        "model": MODEL,
        "max_tokens": max_tokens,
        "stream": stream,
        "messages": [{"role": "user", "content": text}],
    }
    with httpx.stream(
        "POST", f"{router_url}/v1/chat/completions", json=body, timeout=timeout
    ) as response:
        response.read()
    response.raise_for_status()
    return response


def publisher_args() -> list[str]:
    return [sys.executable, "manage.py", "run_publisher"]


def describe_logs(stack: Stack) -> str:
    return "\n".join(
        f"--- {r.name}\n{r.log.read_text(errors='replace')[-2000:]}" for r in stack.routers
    )
