"""enginesim server fixtures: real `python -m enginesim serve` processes on loopback ports."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from devharness import free_ports, start_process, stop_process, wait_http

REPO = Path(__file__).resolve().parents[2]
# 20x faster than the simulated H20: requests take milliseconds, the engine's
# schedule (and so every count the tests check) is unchanged.
TEST_TIME_SCALE = 0.05
STARTUP_TIMEOUT = 30.0


@dataclass
class SimServer:
    base_port: int
    instances: int
    admin_port: int
    kv_base_port: int | None
    proc: subprocess.Popen[bytes]

    def url(self, index: int = 0) -> str:
        return f"http://127.0.0.1:{self.base_port + index}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def kv_endpoint(self, index: int) -> str:
        assert self.kv_base_port is not None
        return f"tcp://127.0.0.1:{self.kv_base_port + index}"

    def kv_replay_endpoint(self, index: int) -> str:
        assert self.kv_base_port is not None
        return f"tcp://127.0.0.1:{self.kv_base_port + 100 + index}"


def start_server(instances: int = 1, kv_events: bool = True, *extra: str) -> SimServer:
    base = free_ports(instances + 1)
    kv_base = free_ports(instances, gap=100) if kv_events else None  # PUB k, replay 100+k
    args = [
        sys.executable, "-m", "enginesim", "serve",
        "--instances", str(instances), "--base-port", str(base + 1),
        "--admin-port", str(base), "--gpu", "h20", "--model", "qwen2-7b",
        "--time-scale", str(TEST_TIME_SCALE), *extra,
    ]  # fmt: skip
    if kv_base is not None:
        args += ["--kv-events", f"tcp://127.0.0.1:{kv_base}"]
    proc = start_process(
        args,
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdin=None,
        stdout=None,
        stderr=None,
    )
    server = SimServer(base + 1, instances, base, kv_base, proc)
    try:
        wait_http(
            server.url(0) + "/health",
            STARTUP_TIMEOUT,
            process=proc,
            ok=lambda status: status == 200,
        )
    except Exception:
        stop_server(server)
        raise
    return server


def stop_server(server: SimServer) -> None:
    stop_process(server.proc)


@pytest.fixture(scope="session")
def sim() -> Iterator[SimServer]:
    """Four instances shared by the test modules: 0 API, 1 metrics, 2 KV events, 3 faults."""
    server = start_server(4)
    yield server
    stop_server(server)


@pytest.fixture
def sim_factory() -> Iterator[Callable[..., SimServer]]:
    """Start extra servers with other options; stopped after the test."""
    started: list[SimServer] = []

    def factory(*extra: str, instances: int = 1, kv_events: bool = True) -> SimServer:
        server = start_server(instances, kv_events, *extra)
        started.append(server)
        return server

    yield factory
    for server in started:
        stop_server(server)
