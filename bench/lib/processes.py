"""The processes under test: one enginesim (with its request log) and routers in front of
it, started and stopped with devharness."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.lib.loadclient import MODEL, closed_loop, run_async
from devharness import (
    WaitTimeout,
    free_port,
    free_ports,
    start_process,
    stop_process,
    wait_http,
    wait_until,
)

REPO = Path(__file__).resolve().parents[2]
INSTANCES = 4
# The routers' admin token: their /metrics needs it (bench.lib.stats sends it).
ROUTER_ADMIN_TOKEN = "bench-admin-token"
STARTUP_S = 30.0


def is_200(status: int) -> bool:
    return status == 200


class EngineLog:
    """The engines' ``--request-log``, read incrementally: request id → its record."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.records: dict[str, dict[str, Any]] = {}

    def read(self) -> None:
        if not self.path.exists():
            return
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            data = handle.read()
        complete = data.rfind(b"\n") + 1
        self.offset += complete
        for line in data[:complete].splitlines():
            record = json.loads(line)
            self.records[record["request_id"].removeprefix("cmpl-")] = record

    def of(self, wanted: set[str], wait: float = 5.0) -> dict[str, dict[str, Any]]:
        """The records of ``wanted`` ids, waiting up to ``wait`` s for late ones."""
        with contextlib.suppress(WaitTimeout):  # then what has been written
            wait_until(lambda: self._read_has(wanted), wait, "the engine's records")
        return {rid: self.records[rid] for rid in wanted if rid in self.records}

    def _read_has(self, wanted: set[str]) -> bool:
        self.read()
        return wanted <= self.records.keys()


@dataclass
class BenchStack:
    """enginesim (``INSTANCES`` instances, one process) and two routers in front of it."""

    ports: list[int]
    engines: subprocess.Popen[bytes]
    routers: dict[str, tuple[int, subprocess.Popen[bytes]]]  # policy → (port, process)
    engine_log: EngineLog

    def stop(self) -> None:
        for proc in [self.engines, *(proc for _, proc in self.routers.values())]:
            stop_process(proc)


@contextlib.contextmanager
def bench_stack(time_scale: float, workdir: Path) -> Iterator[BenchStack]:
    """enginesim at ``time_scale``, then routers in front of it: lmetric and round_robin."""
    ports, engines, log = start_engines(INSTANCES, time_scale, workdir)
    started = BenchStack(ports, engines, {}, log)
    try:
        for policy in ("lmetric", "round_robin"):
            started.routers[policy] = start_router(ports, policy, workdir)
        run_async(closed_loop([started.routers["lmetric"][0]], 8, 1.0, True, 4))  # warm-up
        yield started
    finally:
        started.stop()


def start_engines(
    count: int, time_scale: float, workdir: Path
) -> tuple[list[int], subprocess.Popen[bytes], EngineLog]:
    """One enginesim process serving ``count`` H20 / Qwen2-7B instances, with its request
    log, each instance answering ``/health``."""
    base = free_ports(count)
    log = workdir / f"engine-requests-{base}.jsonl"
    engines = start_process(
        [
            sys.executable,
            "-m",
            "enginesim",
            "serve",
            "--instances",
            str(count),
            "--base-port",
            str(base),
            "--time-scale",
            str(time_scale),
            "--request-log",
            str(log),
        ],
        cwd=REPO,
        stdin=None,
        stderr=None,
    )
    ports = [base + k for k in range(count)]
    try:
        for port in ports:
            wait_http(f"http://127.0.0.1:{port}/health", STARTUP_S, process=engines, ok=is_200)
    except BaseException:
        stop_process(engines)
        raise
    return ports, engines, EngineLog(log)


def start_router(
    ports: list[int], policy: str, workdir: Path, tree: Path = REPO
) -> tuple[int, subprocess.Popen[bytes]]:
    """A router over ``ports`` under ``policy``, run from the root of ``tree`` (so that
    checkout's code is used: the side-by-side bench's "before" rows)."""
    spec = {"kind": policy, "params": {}}
    instances = [{"name": f"i{k}", "url": f"http://127.0.0.1:{p}"} for k, p in enumerate(ports)]
    config: dict[str, Any] = {
        "model": MODEL,
        "policy": spec,
        "instances": instances,
        "router": {"max_concurrency": 4096},
    }
    router_port = free_port()
    path = workdir / f"router-{policy}-{router_port}.json"
    path.write_text(json.dumps(config))
    router = start_process(
        [
            sys.executable,
            "-m",
            "router_worker",
            "--config",
            str(path),
            "--port",
            str(router_port),
            "--redis-url",
            "none",
            "--admin-token",
            ROUTER_ADMIN_TOKEN,
            "--log-level",
            "WARNING",
        ],
        cwd=tree,
        stdin=None,
        stderr=None,
    )
    wait_http(f"http://127.0.0.1:{router_port}/health", STARTUP_S, process=router, ok=is_200)
    return router_port, router
