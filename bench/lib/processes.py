"""The processes under test: one enginesim (with its request log), routers in front of it,
and nginx as a reference hop; started and stopped with devharness."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.lib.loadclient import MODEL, Run, closed_loop, run_async
from devharness import (
    ManagedProcess,
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
# The probe canary's salt: the prober knows it, so it can pick session keys in the probe arm.
PROBE_CANARY_SALT = "bench-probe-salt"
STARTUP_S = 30.0


def is_200(status: int) -> bool:
    return status == 200


class EngineLog:
    """The engines' ``--request-log``, read incrementally: request id → timing record."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.records: dict[str, dict[str, Any]] = {}

    def engine_ttft(self, run: Run, wait: float = 5.0) -> dict[str, float]:
        """The engine's own TTFT (handler start → first content chunk) of each of ``run``'s
        streams, by request id; waits for records still being written."""
        wanted = {o.request_id for o in run.outcomes if o.first is not None}
        with contextlib.suppress(WaitTimeout):  # then what has been written
            wait_until(lambda: self._ttft(wanted).keys() == wanted, wait, "the engine's records")
        return self._ttft(wanted)

    def _ttft(self, wanted: set[str]) -> dict[str, float]:
        self._read()
        return {
            rid: rec["first_token"] - rec["arrival"]
            for rid in wanted
            if (rec := self.records.get("cmpl-" + rid)) and rec["first_token"]
        }

    def _read(self) -> None:
        if not self.path.exists():
            return
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            data = handle.read()
        complete = data.rfind(b"\n") + 1
        self.offset += complete
        for line in data[:complete].splitlines():
            record = json.loads(line)
            self.records[record["request_id"]] = record


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
def bench_stack(
    time_scale: float, workdir: Path, probe_url: str | None = None
) -> Iterator[BenchStack]:
    """enginesim at ``time_scale``, then routers in front of it: lmetric and round_robin
    (with ``probe_url``, each with a probe arm over that engine: see ``start_router``)."""
    ports, engines, log = start_engines(INSTANCES, time_scale, workdir)
    started = BenchStack(ports, engines, {}, log)
    try:
        for port in ports:
            wait_http(f"http://127.0.0.1:{port}/health", STARTUP_S, process=engines, ok=is_200)
        for policy in ("lmetric", "round_robin"):
            started.routers[policy] = start_router(ports, policy, workdir, probe_url)
        run_async(closed_loop([started.routers["lmetric"][0]], 8, 1.0, True, 4))  # warm-up
        yield started
    finally:
        started.stop()


def start_engines(
    count: int, time_scale: float, workdir: Path
) -> tuple[list[int], subprocess.Popen[bytes], EngineLog]:
    """One enginesim process serving ``count`` instances, with its request log."""
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
    return [base + k for k in range(count)], engines, EngineLog(log)


def start_router(
    ports: list[int], policy: str, workdir: Path, probe_url: str | None = None
) -> tuple[int, Any]:
    """A router over ``ports``. With ``probe_url``: a canary config whose ``load`` arm
    (weight 99) holds the engines and whose ``probe`` arm (weight 1) holds only the probe
    engine, both under ``policy``; requests pick their arm by ``X-Session-ID``."""
    spec = {"kind": policy, "params": {}}
    instances = [{"name": f"i{k}", "url": f"http://127.0.0.1:{p}"} for k, p in enumerate(ports)]
    config: dict[str, Any] = {
        "model": MODEL,
        "policy": spec,
        "instances": instances,
        "router": {"max_concurrency": 4096},
    }
    if probe_url:
        config["instances"] = [*instances, {"name": "probe", "url": probe_url}]
        config["canary"] = {
            "salt": PROBE_CANARY_SALT,
            "arms": [
                {
                    "name": "load",
                    "policy": spec,
                    "weight": 99,
                    "instances": [i["name"] for i in instances],
                },
                {"name": "probe", "policy": spec, "weight": 1, "instances": ["probe"]},
            ],
        }
    path = workdir / f"router-{policy}.json"
    path.write_text(json.dumps(config))
    router_port = free_port()
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
        cwd=REPO,
        stdin=None,
        stderr=None,
    )
    wait_http(f"http://127.0.0.1:{router_port}/health", STARTUP_S, process=router, ok=is_200)
    return router_port, router


@contextlib.contextmanager
def nginx_in_front(upstream: int, workdir: Path) -> Iterator[int | None]:
    """nginx as a streaming reverse proxy to port ``upstream`` (keep-alive upstream, no
    buffering); yields its port, or None when nginx is not installed."""
    binary = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin")
    if binary is None:
        yield None
        return
    port = free_port()
    conf = workdir / f"nginx-{port}.conf"
    conf.write_text(NGINX_CONF.format(workdir=workdir, port=port, upstream=upstream))
    with ManagedProcess([binary, "-c", str(conf), "-p", str(workdir)]) as nginx:
        wait_http(f"http://127.0.0.1:{port}/health", STARTUP_S, process=nginx.process, ok=is_200)
        yield port


NGINX_CONF = """worker_processes 1; daemon off; pid {workdir}/nginx.pid;
error_log {workdir}/nginx-error.log;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  upstream engine {{ server 127.0.0.1:{upstream}; keepalive 64; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://engine; proxy_http_version 1.1; proxy_set_header Connection "";
      proxy_buffering off; proxy_request_buffering off;
    }}
  }}
}}
"""


@contextlib.contextmanager
def paused(routers: Iterable[tuple[int, subprocess.Popen[bytes]]]) -> Iterator[None]:
    """Stop the routers not under test (SIGSTOP): their scrapes and health probes would
    stall the engines' event loop in the other arms' runs."""
    stopped = [proc for _, proc in routers]
    for proc in stopped:
        proc.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        for proc in stopped:
            proc.send_signal(signal.SIGCONT)
