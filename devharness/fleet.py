"""An enginesim fleet: one ``python -m enginesim serve`` process serving ``size`` simulated
vLLM instances on consecutive loopback ports, with its admin port (faults) and, optionally,
its KV-event ports. The one place the tests, the benches and the demo start a fleet."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx

from devharness.ports import free_port, free_ports
from devharness.processes import ManagedProcess, ProcessExited
from devharness.waits import WaitTimeout, wait_until
from engine_interface import read_samples, sample_total

REPO = Path(__file__).resolve().parents[1]
PYTHON_UNBUFFERED = {"PYTHONUNBUFFERED": "1"}
# Instance k's KV-event replay (ROUTER) socket is on the PUB port + this (enginesim's layout).
KV_REPLAY_OFFSET = 100


def scrape_total(
    url: str,
    name: str,
    *,
    labels: Mapping[str, str] | None = None,
    headers: Mapping[str, str] | None = None,
) -> float:
    """Sum of the samples ``name`` (with ``labels`` among theirs) on ``url``/metrics; every
    line must parse. ``headers``: e.g. a router's admin token (an engine needs none)."""
    response = httpx.get(url + "/metrics", timeout=5, headers=dict(headers or {}))
    response.raise_for_status()
    samples, skipped = read_samples(response.text)
    assert skipped == 0, f"{url}/metrics: {skipped} unreadable lines"
    return sample_total(samples, name, **(labels or {}))


class Fleet:
    """``size`` instances of ``model`` on ``gpu``, ``time_scale`` wall seconds per simulated
    second. Ports not given are picked free, and with picked instance ports a start that
    fails (another suite took a port first) is retried on new ones, ``attempts`` times in
    all. ``kv_events`` publishes KV events (``kv_encoding``: enginesim's default, or
    ``array`` as vLLM's msgspec sends them).
    ``variation``: the fleet-variation flags (``--speeds``, ``--perturb``, ...), ``extra``: any
    other ``serve`` flags, ``prefix``: a command to run it under (``taskset -c 0``).

    Output goes to ``log`` (appended); without one stdout is discarded and stderr is the
    caller's (a test's captured output). ``new_session``: its own process group.

    ``start()`` waits until every instance and the admin API answer (``wait=False``: returns
    at once; see :meth:`healthy`); ``with Fleet(...) as fleet`` starts it and always stops it.
    """

    def __init__(
        self,
        size: int = 1,
        *,
        gpu: str = "h20",
        model: str = "qwen2-7b",
        time_scale: float = 1.0,
        kv_events: bool = False,
        kv_encoding: str | None = None,
        variation: Sequence[str] = (),
        extra: Sequence[str] = (),
        base_port: int | None = None,
        admin_port: int | None = None,
        kv_port: int | None = None,
        log: Path | None = None,
        cwd: Path | str = REPO,
        env: Mapping[str, str] | None = None,
        prefix: Sequence[str] = (),
        new_session: bool = False,
        attempts: int = 3,
        startup_timeout: float = 30.0,
        grace: float = 10.0,
    ) -> None:
        if size < 1:
            raise ValueError("a fleet has at least one instance")
        self.size = size
        self.gpu = gpu
        self.model = model
        self.time_scale = time_scale
        self.kv_events = kv_events
        self.kv_encoding = kv_encoding
        self.variation = list(variation)
        self.extra = list(extra)
        self.log = log
        self.cwd = cwd
        self.env = env
        self.prefix = list(prefix)
        self.new_session = new_session
        self.attempts = attempts
        self.startup_timeout = startup_timeout
        self.grace = grace
        self._fixed = (base_port, admin_port, kv_port)
        self.base_port, self.admin_port, self.kv_port = self._fixed
        self.managed: ManagedProcess | None = None

    # ----------------------------------------------------------------- addresses

    def url(self, index: int = 0) -> str:
        return f"http://127.0.0.1:{self._ports()[0] + index}"

    def urls(self) -> list[str]:
        return [self.url(k) for k in range(self.size)]

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self._ports()[1]}"

    def kv_endpoint(self, index: int) -> str:
        """Instance ``index``'s KV-event PUB socket."""
        return f"tcp://127.0.0.1:{self._kv_port() + index}"

    def kv_replay_endpoint(self, index: int) -> str:
        """Instance ``index``'s KV-event replay socket."""
        return f"tcp://127.0.0.1:{self._kv_port() + KV_REPLAY_OFFSET + index}"

    def instances(self, kv: bool = False) -> list[dict[str, Any]]:
        """The ``instances`` of a router configuration: ``i{k}`` at instance k's URL (and
        its KV-event sockets with ``kv``)."""
        out = []
        for k in range(self.size):
            spec: dict[str, Any] = {"name": f"i{k}", "url": self.url(k)}
            if kv:
                spec["kv_events"] = self.kv_endpoint(k)
                spec["kv_replay"] = self.kv_replay_endpoint(k)
            out.append(spec)
        return out

    def _ports(self) -> tuple[int, int]:
        if self.base_port is None or self.admin_port is None:
            raise RuntimeError("the fleet was never started")
        return self.base_port, self.admin_port

    def _kv_port(self) -> int:
        if self.kv_port is None:
            raise RuntimeError("the fleet publishes no KV events")
        return self.kv_port

    # ----------------------------------------------------------------- faults and metrics

    def fault(self, index: int, mode: str, **extra: Any) -> None:
        """Inject fault ``mode`` into instance ``index`` (``recover`` clears it)."""
        response = httpx.post(
            self.admin_url + "/admin/fault",
            json={"instance": index, "mode": mode, **extra},
            timeout=5,
        )
        response.raise_for_status()

    def recover(self, timeout: float = 30.0) -> None:
        """Clear every instance's fault and wait until each answers again (a killed one
        reopens its port)."""
        for index in range(self.size):
            self.fault(index, "recover")
        wait_until(self.healthy, timeout, "enginesim instances back", self.process, log=self.log)

    def metric(self, index: int, name: str, **labels: str) -> float:
        """Sum of instance ``index``'s ``/metrics`` samples ``name`` with ``labels``."""
        return scrape_total(self.url(index), name, labels=labels)

    # ----------------------------------------------------------------- the process

    def command(self) -> list[str]:
        base, admin = self._ports()
        argv = [
            *self.prefix, sys.executable,
            "-m", "enginesim", "serve",
            "--instances", str(self.size), "--base-port", str(base), "--admin-port", str(admin),
            "--gpu", self.gpu, "--model", self.model, "--time-scale", str(self.time_scale),
        ]  # fmt: skip
        if self.kv_events:
            argv += ["--kv-events", f"tcp://127.0.0.1:{self._kv_port()}"]
            if self.kv_encoding is not None:
                argv += ["--kv-encoding", self.kv_encoding]
        return [*argv, *self.variation, *self.extra]

    @property
    def process(self) -> subprocess.Popen[bytes]:
        """The running process."""
        if self.managed is None:
            raise RuntimeError("the fleet was never started")
        return self.managed.running

    def healthy(self) -> bool:
        """Every instance answers ``/health`` with 200, and the admin API answers."""
        try:
            if httpx.get(self.admin_url + "/admin/instances", timeout=1).status_code != 200:
                return False
            return all(
                httpx.get(url + "/health", timeout=1).status_code == 200 for url in self.urls()
            )
        except httpx.HTTPError:
            return False

    def start(self, wait: bool = True) -> Self:
        """Start the fleet (and with ``wait``, until it is healthy)."""
        # a clash on a fixed instance port would only repeat
        attempts = self.attempts if self._fixed[0] is None else 1
        for attempt in range(attempts):
            self._pick_ports()
            env = {**(self.env if self.env is not None else os.environ), **PYTHON_UNBUFFERED}
            popen: dict[str, Any] = {} if self.log is not None else {"stderr": None}
            self.managed = ManagedProcess(
                self.command(),
                env=env,
                log=self.log,
                cwd=self.cwd,
                new_session=self.new_session,
                grace=self.grace,
                **popen,
            ).start()
            if not wait:
                return self
            try:
                wait_until(
                    self.healthy, self.startup_timeout, "enginesim", self.process, log=self.log
                )
                return self
            except (WaitTimeout, ProcessExited):
                self.stop()
                if attempt == attempts - 1:
                    raise
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")

    def _pick_ports(self) -> None:
        base, admin, kv = self._fixed
        if base is None:
            first = free_ports(self.size + 1)
            base, admin = first + 1, admin if admin is not None else first
        elif admin is None:
            admin = free_port()
        if self.kv_events and kv is None:
            kv = free_ports(self.size, gap=KV_REPLAY_OFFSET)
        self.base_port, self.admin_port, self.kv_port = base, admin, kv

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds (its group with ``new_session``)."""
        if self.managed is not None:
            self.managed.stop()

    def tail(self, chars: int = 3000) -> str:
        return "" if self.managed is None else self.managed.tail(chars)

    def __enter__(self) -> Self:
        return self.start() if self.managed is None else self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
