"""The names bench/bench_intake_stall.py imports from tests/router/conftest.py, from before
fleets and routers were started by devharness: delete this module (and its import in the
conftest) when that bench starts its fleet and routers with devharness itself."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from devharness import Fleet, Router
from tests.fleets import TIME_SCALE
from tests.router.helpers import ADMIN_HEADERS, MODEL, router_config
from tests.router.helpers import launch_router as launch

__all__ = ["ADMIN_HEADERS", "MODEL", "launch_router", "router_config", "start_fleet"]


class BenchFleet(Fleet):
    @property
    def proc(self) -> subprocess.Popen[bytes]:
        return self.process


@dataclass
class BenchRouter(Router):
    @property
    def proc(self) -> subprocess.Popen[bytes]:
        return self.process


def start_fleet(size: int, *extra: str) -> BenchFleet:
    """The router tests' fleet (tests/router/helpers.py's ``kv_fleet``), started."""
    options: dict[str, Any] = {"kv_events": True, "kv_encoding": "array", "extra": extra}
    return BenchFleet(size, time_scale=TIME_SCALE, **options).start()


def launch_router(directory: Path, document: dict[str, Any] | None = None) -> BenchRouter:
    router = launch(directory, document)
    return BenchRouter(**{f.name: getattr(router, f.name) for f in fields(router)})
