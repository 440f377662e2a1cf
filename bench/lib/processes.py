"""The processes under test: one enginesim (with its request log) and routers in front of
it, started and stopped with devharness."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.lib.loadclient import MODEL, closed_loop, run_async
from devharness import Fleet, Router, WaitTimeout, start_router, stop_together, wait_until

REPO = Path(__file__).resolve().parents[2]
INSTANCES = 4
# The routers' admin token: their /metrics needs it (bench.lib.stats sends it).
ROUTER_ADMIN_TOKEN = "bench-admin-token"


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

    fleet: Fleet
    routers: dict[str, Router]  # policy → its router

    @property
    def ports(self) -> list[int]:
        """The engines' ports (the load client's targets)."""
        return engine_ports(self.fleet)


@contextlib.contextmanager
def bench_stack(time_scale: float, workdir: Path) -> Iterator[BenchStack]:
    """enginesim at ``time_scale``, then routers in front of it: lmetric and round_robin."""
    with start_engines(INSTANCES, time_scale, workdir) as (fleet, _):
        started = BenchStack(fleet, {})
        try:
            for policy in ("lmetric", "round_robin"):
                started.routers[policy] = start_bench_router(fleet.urls(), policy, workdir)
            warm = [started.routers["lmetric"].port]
            run_async(closed_loop(warm, 8, 1.0, True, 4))
            yield started
        finally:
            stop_together([router.managed for router in started.routers.values()], 10.0)


@contextlib.contextmanager
def start_engines(
    count: int, time_scale: float, workdir: Path
) -> Iterator[tuple[Fleet, EngineLog]]:
    """A devharness.Fleet of ``count`` H20 / Qwen2-7B enginesim instances with its request
    log, every instance healthy; stopped on exit."""
    log = workdir / f"engine-requests-{os.getpid()}-{time.monotonic_ns()}.jsonl"
    with Fleet(count, time_scale=time_scale, extra=["--request-log", str(log)]) as fleet:
        yield fleet, EngineLog(log)


def engine_ports(fleet: Fleet) -> list[int]:
    return [int(url.rsplit(":", 1)[1]) for url in fleet.urls()]


def start_bench_router(urls: list[str], policy: str, workdir: Path, tree: Path = REPO) -> Router:
    """A router over the engines at ``urls`` under ``policy``, run from the root of ``tree``
    (so that checkout's code is used: the side-by-side bench's "before" rows)."""
    instances = [{"name": f"i{k}", "url": url} for k, url in enumerate(urls)]
    config: dict[str, Any] = {
        "model": MODEL,
        "policy": {"kind": policy, "params": {}},
        "instances": instances,
        "router": {"max_concurrency": 4096},
    }
    return start_router(
        workdir, config, admin_token=ROUTER_ADMIN_TOKEN, log_level="WARNING", log=False, cwd=tree
    )
