"""Real processes for the end-to-end browser tests: routers in managed mode fetching their
configuration from the control plane in front of an enginesim fleet (tests/fleets.py), the
ASGI app and the publisher."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis
from django.conf import settings

from controlplane.models import Cluster
from controlplane.services import router_deployments as router_service
from devharness import TRANSIENT, Router, free_port, stop_process, wait_until
from devharness import start_router as start_router_process
from router_worker.contract.telemetry import loads_state, state_key

from .helpers import SYSTEM, subprocess_env

MODEL = "Qwen/Qwen2-7B-Instruct"
ADMIN_TOKEN = "web-tests-admin-token"


# Probes that fail while a stack is still coming up: not yet, rather than wrong.
STARTING = (*TRANSIENT, redis.RedisError, ValueError)


def wait_for(check: Callable[[], Any], timeout: float, what: str) -> Any:
    return wait_until(check, timeout, what, ignore=STARTING, interval=0.1)


def start_router(cluster: Cluster, name: str, control_plane: str, directory: Path) -> Router:
    """A router in managed mode: configuration from the control plane's API, versions
    announced on Redis pub/sub, heartbeats back."""
    port = free_port()
    token, deployment = router_service.create_router_deployment(
        SYSTEM, cluster.pk, name=name, host="127.0.0.1", port=port
    )
    return start_router_process(
        directory,
        None,
        "--control-plane", control_plane,
        "--deployment", str(deployment.pk),
        "--token", token,
        "--state-dir", str(directory / f"state-{name}"),
        "--poll-interval", "2",
        "--heartbeat-interval", "1",
        port=port,
        name=name,
        admin_token=ADMIN_TOKEN,
        redis_url=settings.REDIS_URL,
        log_level="WARNING",
        env=subprocess_env(),
        wait=False,
    )  # fmt: skip


@dataclass
class Stack:
    cluster: Cluster
    routers: list[Router]
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


def describe_logs(stack: Stack) -> str:
    return "\n".join(f"--- {r.name}\n{r.log()[-2000:]}" for r in stack.routers)
