"""Drill fixtures: an enginesim fleet of four and routers on loopback (helpers shared with
tests/router), plus a private Redis. Every process is stopped in teardown."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from devharness import free_ports, stop_process
from tests.router.conftest import (
    Fleet,
    PrivateRedis,
    router_factory,  # noqa: F401  re-exported fixture: the drills start routers with it
    start_fleet,
)

# Fast failure detection: what an operator would configure for a latency-sensitive fleet.
DRILL_ROUTER = {
    "scrape_interval_s": 0.2,
    "health_interval_s": 0.2,
    "breaker_open_s": 0.5,
    "connect_timeout_s": 0.3,
    "first_byte_timeout_s": 1.0,
    "kv_events": False,
}


@pytest.fixture(scope="session")
def drill_fleet() -> Iterator[Fleet]:
    """Shared by every drill; each drill recovers the faults it injects."""
    fleet = start_fleet(4)
    yield fleet
    stop_process(fleet.proc)


def drill_config(fleet: Fleet, kind: str = "lmetric", **router: Any) -> dict[str, Any]:
    return {
        "cluster": "drill",
        "model": "Qwen/Qwen2-7B-Instruct",
        "instances": fleet.instances(),
        "policy": {"kind": kind, "params": {}},
        "router": {**DRILL_ROUTER, **router},
    }


@pytest.fixture
def drill_redis() -> Iterator[PrivateRedis]:
    """A throwaway redis-server: the machine's shared one is never stopped."""
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed")
    directory = tempfile.mkdtemp(prefix="sy-drill-redis-")
    server = PrivateRedis(free_ports(1), directory)
    server.start()
    yield server
    server.stop()
    shutil.rmtree(directory, ignore_errors=True)
