"""``python -m router_worker`` processes on loopback: standalone on a configuration document,
or managed (its flags in ``extra``), started the same way by the tests and the benches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from devharness.fleet import REPO
from devharness.ports import free_port
from devharness.processes import ManagedProcess
from devharness.waits import wait_until


def router_env(**extra: str) -> dict[str, str]:
    """This process's environment without its ``SWITCHYARD_*`` settings (a router reads
    some of them), plus ``extra``."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD_")}
    return {**inherited, **extra}


@dataclass
class Router:
    name: str
    port: int
    managed: ManagedProcess
    log_path: Path | None
    config_path: Path | None
    admin_token: str | None

    @property
    def process(self) -> subprocess.Popen[bytes]:
        return self.managed.running

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_token}"} if self.admin_token else {}

    def state(self) -> dict[str, Any]:
        response = httpx.get(self.url + "/admin/state", headers=self.admin_headers, timeout=5)
        response.raise_for_status()
        return response.json()

    def health_of(self, instance: str) -> str:
        instances = self.state()["snapshot"]["instances"]
        return next(i["health"] for i in instances if i["name"] == instance)

    def metrics(self) -> str:
        response = httpx.get(self.url + "/metrics", headers=self.admin_headers, timeout=5)
        response.raise_for_status()
        return response.text

    def log(self) -> str:
        return "" if self.log_path is None else self.log_path.read_text(errors="replace")

    def healthy(self) -> bool:
        return httpx.get(self.url + "/health", timeout=1).status_code == 200

    def wait_healthy(self, timeout: float = 30.0) -> None:
        wait_until(self.healthy, timeout, f"router {self.name}", self.process, log=self.log_path)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s (its group with ``new_session``)."""
        self.managed.stop()


def start_router(
    directory: Path,
    config: Mapping[str, Any] | None = None,
    *extra: str,
    port: int | None = None,
    name: str | None = None,
    admin_token: str | None = None,
    redis_url: str | None = "none",
    log_level: str = "INFO",
    log: bool | Path = True,
    env: Mapping[str, str] | None = None,
    cwd: Path | str = REPO,
    new_session: bool = False,
    wait: bool = True,
    timeout: float = 30.0,
) -> Router:
    """Start a router on ``port`` (picked free by default), named ``name`` (``r{port}``).
    ``config`` (written to ``directory``) makes it standalone; managed routers pass their
    ``--control-plane`` flags in ``extra``. Its log is ``directory``/router-{port}.log, or
    the file ``log`` (``log=False``: stdout discarded, stderr the caller's). ``env``: its
    whole environment (default: :func:`router_env`). ``cwd``: the checkout whose code it
    runs. ``new_session``: its own process group. With ``wait``, returns once it answers
    ``/health`` (stopped if it never does)."""
    port = free_port() if port is None else port
    name = f"r{port}" if name is None else name
    argv = [sys.executable, "-m", "router_worker", "--port", str(port), "--name", name]
    argv += ["--log-level", log_level]
    if admin_token is not None:
        argv += ["--admin-token", admin_token]
    if redis_url is not None:
        argv += ["--redis-url", redis_url]
    config_path = None
    if config is not None:
        config_path = directory / f"router-{port}.json"
        config_path.write_text(json.dumps(config))
        argv += ["--config", str(config_path)]
    log_path = log if isinstance(log, Path) else directory / f"router-{port}.log" if log else None
    popen: dict[str, Any] = {} if log_path is not None else {"stderr": None}
    managed = ManagedProcess(
        [*argv, *extra],
        cwd=cwd,
        log=log_path,
        env={**(router_env() if env is None else env), "PYTHONUNBUFFERED": "1"},
        new_session=new_session,
        **popen,
    ).start()
    router = Router(name, port, managed, log_path, config_path, admin_token)
    if wait:
        try:
            router.wait_healthy(timeout)
        except BaseException:
            router.stop()
            raise
    return router
