"""`scripts/demo.py` itself, run as `make demo` runs it, on the test's database and Redis
database (emptied first, as every demo run does) and on free ports."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
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


PORT_TAKEN = "Address already in use"
ATTEMPTS = 3  # the demo binds the ports it is given; another suite may take one first


@contextmanager
def demo_stack(directory: Path, **env: str) -> Iterator[Demo]:
    """The demo's whole stack (``env``: more of its knobs), stopped on leaving. Its ports are
    only likely free (devharness.ports): a demo that stops because one was taken before it
    bound it is started again on others."""
    for attempt in range(ATTEMPTS):
        run = directory / f"run{attempt}"
        run.mkdir()
        ports = _free_ports()
        process = _start(run, ports, env)
        try:
            log = run / "demo.log"
            banner = wait_for(partial(_banner, log, process), 150, "the demo's banner")
        except DemoExited as exited:
            process.stop()
            if PORT_TAKEN in str(exited) and attempt < ATTEMPTS - 1:
                continue
            raise AssertionError(str(exited)) from None
        except BaseException:
            process.stop()
            raise
        try:
            yield _demo(banner, ports, process)
        finally:
            process.stop()
        assert "Stopped every process the demo started." in (run / "demo.log").read_text()
        return


class DemoExited(Exception):
    pass


def _free_ports() -> dict[str, int]:
    engines = free_ports(17)  # the engines' admin API on the first, instance k on base + 1 + k
    pd_engines = free_ports(5)  # the same for the disaggregated cluster's four
    return {
        "SWITCHYARD_PORT": free_port(),
        "SWITCHYARD_ROUTER_PORT": free_port(),
        "SWITCHYARD_DEMO_ENGINE_PORT": engines + 1,
        "SWITCHYARD_DEMO_KV_PORT": free_ports(16),
        "SWITCHYARD_DEMO_PD_ROUTER_PORT": free_port(),
        "SWITCHYARD_DEMO_PD_ENGINE_PORT": pd_engines + 1,
        "SWITCHYARD_DEMO_PD_KV_PORT": free_ports(4),
    }


def _start(run: Path, ports: dict[str, int], env: dict[str, str]) -> ManagedProcess:
    environment = {
        **subprocess_env(),
        **{name: str(port) for name, port in ports.items()},
        "SWITCHYARD_VAR_DIR": str(run / "var"),
        "SWITCHYARD_CONTROL_PLANE_URL": f"http://127.0.0.1:{ports['SWITCHYARD_PORT']}",
        **env,
    }
    return ManagedProcess(
        [sys.executable, str(ROOT / "scripts" / "demo.py")],
        env=environment,
        log=run / "demo.log",
        cwd=ROOT,
        new_session=True,
        grace=60,
    ).start()


def _demo(banner: str, ports: dict[str, int], process: ManagedProcess) -> Demo:
    cluster = re.search(r"dashboard: \S+/clusters/(\d+)/", banner)
    password = re.search(r"operator / (\S+)", banner)
    assert cluster and password, banner
    pd = re.search(r"disaggregated: \S+/clusters/(\d+)/", banner)
    return Demo(
        f"http://127.0.0.1:{ports['SWITCHYARD_PORT']}",
        f"http://127.0.0.1:{ports['SWITCHYARD_ROUTER_PORT']}",
        int(cluster.group(1)),
        password.group(1),
        banner,
        process,
        f"http://127.0.0.1:{ports['SWITCHYARD_DEMO_PD_ROUTER_PORT']}",
        int(pd.group(1)) if pd else None,
    )


def _banner(log: Path, process: ManagedProcess) -> str | None:
    if process.poll() is not None:
        raise DemoExited(f"the demo exited:\n{process.tail()}")
    text = log.read_text() if log.exists() else ""
    return text if "Press Ctrl-C to stop everything." in text else None
