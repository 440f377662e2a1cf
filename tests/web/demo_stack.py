"""`scripts/demo.py` itself, run as `make demo` runs it, on the test's database and Redis
database (emptied first, as every demo run does) and on free ports."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from devharness import ManagedProcess, free_port, free_ports

from .helpers import ROOT, subprocess_env
from .stack import wait_for


@dataclass
class Demo:
    url: str
    router: str
    cluster: int
    password: str
    banner: str
    process: ManagedProcess
    pd_router: str = ""  # the disaggregated cluster's
    pd_cluster: int | None = None


@contextmanager
def demo_stack(directory: Path, **env: str) -> Iterator[Demo]:
    """The demo's whole stack (``env``: more of its knobs), stopped on leaving."""
    port, router, pd_router = free_port(), free_port(), free_port()
    engines = free_ports(17)  # the engines' admin API on the first, instance k on base + 1 + k
    pd_engines = free_ports(5)  # the same for the disaggregated cluster's four
    environment = {
        **subprocess_env(),
        "SWITCHYARD_PORT": str(port),
        "SWITCHYARD_ROUTER_PORT": str(router),
        "SWITCHYARD_DEMO_ENGINE_PORT": str(engines + 1),
        "SWITCHYARD_DEMO_KV_PORT": str(free_ports(16)),
        "SWITCHYARD_DEMO_PD_ROUTER_PORT": str(pd_router),
        "SWITCHYARD_DEMO_PD_ENGINE_PORT": str(pd_engines + 1),
        "SWITCHYARD_DEMO_PD_KV_PORT": str(free_ports(4)),
        "SWITCHYARD_VAR_DIR": str(directory / "var"),
        "SWITCHYARD_CONTROL_PLANE_URL": f"http://127.0.0.1:{port}",
        **env,
    }
    log = directory / "demo.log"
    process = ManagedProcess(
        [sys.executable, str(ROOT / "scripts" / "demo.py")],
        env=environment,
        log=log,
        cwd=ROOT,
        new_session=True,
        grace=60,
    ).start()
    try:
        banner = wait_for(lambda: _banner(log, process), 150, "the demo's banner")
        cluster = re.search(r"dashboard: \S+/clusters/(\d+)/", banner)
        password = re.search(r"operator / (\S+)", banner)
        assert cluster and password, banner
        pd = re.search(r"disaggregated: \S+/clusters/(\d+)/", banner)
        yield Demo(
            f"http://127.0.0.1:{port}",
            f"http://127.0.0.1:{router}",
            int(cluster.group(1)),
            password.group(1),
            banner,
            process,
            f"http://127.0.0.1:{pd_router}",
            int(pd.group(1)) if pd else None,
        )
    finally:
        process.stop()
    assert "Stopped every process the demo started." in log.read_text()


def _banner(log: Path, process: ManagedProcess) -> str | None:
    if process.poll() is not None:
        raise AssertionError(f"the demo exited:\n{process.tail()}")
    text = log.read_text() if log.exists() else ""
    return text if "Press Ctrl-C to stop everything." in text else None
