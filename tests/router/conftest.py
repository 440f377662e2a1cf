"""Real processes on loopback: an enginesim fleet and router_worker processes in front of it."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import redis

from devharness import free_ports, start_process, stop_process, wait_until
from engine_interface import read_samples, sample_total

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
MODEL = "Qwen/Qwen2-7B-Instruct"
ADMIN_TOKEN = "test-admin-token"
ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
# 20x faster than a simulated H20: requests take milliseconds.
TIME_SCALE = 0.05
STARTUP_TIMEOUT = 30.0


def scrape_total(url: str, name: str, **labels: str) -> float:
    """Sum of the samples ``name`` (with ``labels`` among theirs) on ``url``/metrics."""
    # The admin token: a router's /metrics needs it (an engine ignores it).
    text = httpx.get(url + "/metrics", timeout=5, headers=ADMIN_HEADERS).text
    samples, skipped = read_samples(text)
    assert skipped == 0, f"{url}/metrics: {skipped} unreadable lines"
    return sample_total(samples, name, **labels)


@dataclass
class Fleet:
    base_port: int
    size: int
    admin_port: int
    kv_base: int
    proc: subprocess.Popen[bytes]

    def url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.base_port + index}"

    def instances(self, kv: bool = False) -> list[dict[str, Any]]:
        out = []
        for k in range(self.size):
            spec: dict[str, Any] = {"name": f"i{k}", "url": self.url(k)}
            if kv:
                spec["kv_events"] = f"tcp://127.0.0.1:{self.kv_base + k}"
                spec["kv_replay"] = f"tcp://127.0.0.1:{self.kv_base + 100 + k}"
            out.append(spec)
        return out

    def fault(self, index: int, mode: str, **extra: Any) -> None:
        response = httpx.post(
            f"http://127.0.0.1:{self.admin_port}/admin/fault",
            json={"instance": index, "mode": mode, **extra},
            timeout=5,
        )
        response.raise_for_status()

    def engine_metric(self, index: int, name: str, **labels: str) -> float:
        return scrape_total(self.url(index), name, **labels)


def stream_entries(
    client: redis.Redis, stream: str
) -> list[tuple[bytes, dict[bytes | str, bytes | str]]]:
    """Every entry of ``stream``; XRANGE gives an id and fields for each (redis-py's type
    admits None for both)."""
    return cast("list[tuple[bytes, dict[bytes | str, bytes | str]]]", client.xrange(stream))


def _healthy(url: str) -> bool:
    return httpx.get(url + "/health", timeout=1).status_code == 200


def start_fleet(size: int, *extra: str) -> Fleet:
    base = free_ports(size + 1)
    kv_base = free_ports(size, gap=100)
    args = [
        PYTHON,
        "-m",
        "enginesim",
        "serve",
        "--instances",
        str(size),
        "--base-port",
        str(base + 1),
        "--admin-port",
        str(base),
        "--gpu",
        "h20",
        "--model",
        "qwen2-7b",
        "--time-scale",
        str(TIME_SCALE),
        "--kv-events",
        f"tcp://127.0.0.1:{kv_base}",
        "--kv-encoding",
        "array",
        *extra,
    ]
    proc = start_process(
        args, cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdin=None, stderr=None
    )
    fleet = Fleet(base + 1, size, base, kv_base, proc)
    try:
        for k in range(size):
            wait_until(
                functools.partial(_healthy, fleet.url(k)),
                STARTUP_TIMEOUT,
                "enginesim",
                proc,
            )
    except BaseException:
        stop_process(proc)
        raise
    return fleet


@pytest.fixture(scope="session")
def fleet() -> Iterator[Fleet]:
    """Four enginesim instances shared by the router tests (faults are always recovered)."""
    started = start_fleet(4)
    yield started
    stop_process(started.proc)


@dataclass
class Router:
    port: int
    proc: subprocess.Popen[bytes]
    config_path: Path
    log_path: Path
    extra: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin_headers(self) -> dict[str, str]:
        return ADMIN_HEADERS

    def state(self) -> dict[str, Any]:
        response = httpx.get(self.url + "/admin/state", headers=self.admin_headers, timeout=5)
        response.raise_for_status()
        return response.json()

    def health_of(self, name: str) -> str:
        instances = self.state()["snapshot"]["instances"]
        return next(i["health"] for i in instances if i["name"] == name)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> str:
        response = httpx.get(self.url + "/metrics", headers=ADMIN_HEADERS, timeout=5)
        response.raise_for_status()
        return response.text


def router_config(
    fleet: Fleet, kind: str = "lmetric", params: dict[str, Any] | None = None, **extra: Any
) -> dict[str, Any]:
    document: dict[str, Any] = {
        "cluster": "test",
        "model": MODEL,
        "instances": fleet.instances(),
        "policy": {"kind": kind, "params": params or {}},
        "router": {
            "scrape_interval_s": 0.2,
            "health_interval_s": 0.2,
            "breaker_open_s": 0.5,
            "kv_events": False,
        },
    }
    document.update(extra)
    return document


def launch_router(
    directory: Path,
    document: dict[str, Any] | None = None,
    *extra: str,
    redis_url: str = "none",
    wait: bool = True,
    env: dict[str, str] | None = None,
) -> Router:
    """Start ``python -m router_worker`` (standalone when ``document`` is given)."""
    port = free_ports(1)
    config_path = directory / f"router-{port}.json"
    log_path = directory / f"router-{port}.log"
    args = [
        PYTHON,
        "-m",
        "router_worker",
        "--port",
        str(port),
        "--name",
        f"r{port}",
        "--admin-token",
        ADMIN_TOKEN,
        "--redis-url",
        redis_url,
        "--log-level",
        "INFO",
        *extra,
    ]
    if document is not None:
        config_path.write_text(json.dumps(document))
        args += ["--config", str(config_path)]
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD_")}
    proc = start_process(
        args,
        cwd=REPO,
        log=log_path,
        env={**inherited, **(env or {}), "PYTHONUNBUFFERED": "1"},
        stdin=None,
    )
    router = Router(port, proc, config_path, log_path, list(extra))
    if wait:
        try:
            wait_until(
                lambda: httpx.get(router.url + "/health", timeout=1).status_code == 200,
                STARTUP_TIMEOUT,
                "router",
                proc,
                log=log_path,
            )
        except BaseException:
            stop_process(proc)
            raise
    return router


@pytest.fixture
def router_factory(tmp_path: Path) -> Iterator[Callable[..., Router]]:
    """Start router processes; all stopped after the test."""
    started: list[Router] = []

    def start(document: dict[str, Any] | None = None, *extra: str, **options: Any) -> Router:
        router = launch_router(tmp_path, document, *extra, **options)
        started.append(router)
        return router

    yield start
    for router in started:
        stop_process(router.proc)


@dataclass
class PrivateRedis:
    port: int
    directory: str
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = start_process(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.directory,
            ],
            stdin=None,
        )
        import redis

        client = redis.Redis(port=self.port)
        wait_until(lambda: bool(client.ping()), 10, "private redis", self.proc)
        client.close()

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    """A throwaway redis-server (never the machine's shared one: others' tests use it)."""
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed")
    directory = tempfile.mkdtemp(prefix="sy-redis-")
    server = PrivateRedis(free_ports(1), directory)
    server.start()
    yield server
    server.stop()
    shutil.rmtree(directory, ignore_errors=True)
