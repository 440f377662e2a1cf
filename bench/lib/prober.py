"""The prober: a process of its own, idle between probes, that times probes through a
router's probe arm and straight to a probe engine of their own."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.lib.loadclient import MODEL, Client, Outcome, Run, make_prompt, run_async, system_prompt
from bench.lib.processes import PROBE_CANARY_SALT, STARTUP_S, EngineLog, is_200, start_engines
from bench.lib.stats import transit
from devharness import stop_process, wait_http

PROBE_TIME_SCALE = 0.1  # the probe engine's TTFT is subtracted: it only has to stay idle
PROBE_MAX_TOKENS = 2  # a probe ends right after its first token


@dataclass
class ProbeEngine:
    """A one-instance enginesim of its own (own process, own event loop), which only the
    prober's requests reach: its TTFT is short and steady, and it logs each request."""

    port: int
    process: subprocess.Popen[bytes]
    log: EngineLog

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextlib.contextmanager
def probe_engine(workdir: Path) -> Iterator[ProbeEngine]:
    ports, process, log = start_engines(1, PROBE_TIME_SCALE, workdir)
    try:
        wait_http(f"http://127.0.0.1:{ports[0]}/health", STARTUP_S, process=process, ok=is_200)
        yield ProbeEngine(ports[0], process, log)
    finally:
        stop_process(process)


def sessions_in_arm(prefix: str, low: float, high: float) -> Iterator[str]:
    """Session keys the router assigns to the canary arm owning points [low, high)."""
    from router_worker.arms import arm_salt, session_point
    from router_worker.routing import session_key_from_request

    salt = arm_salt(PROBE_CANARY_SALT)

    def point(key: str) -> float:  # as the router derives it from the header
        return session_point(session_key_from_request({"x-session-id": key}, {}) or "", salt)

    return (key for key in (f"{prefix}-{k}" for k in itertools.count()) if low <= point(key) < high)


@dataclass(frozen=True)
class ProbePlan:
    router_port: int
    engine_port: int
    session: str  # puts the routed probes in the router's probe arm
    start_at: float  # time.monotonic() (system-wide) when probing starts
    duration: float
    rate: float  # probes per second, both paths together
    prompt_words: int
    shared_words: int


async def probe_loop(plan: ProbePlan) -> list[tuple[str, Outcome | None]]:
    """Two workers, each alternating a probe through the router and one straight to the
    probe engine, with exponential gaps (Poisson arrivals see the router's time-average
    state); probes share a system prompt, as the load does."""
    nonce = time.perf_counter_ns()
    shared = system_prompt(nonce, plan.shared_words)
    gaps = np.random.default_rng(nonce).exponential(2 / plan.rate, 100_000).tolist()
    results: list[tuple[str, Outcome | None]] = []
    await asyncio.sleep(max(plan.start_at - time.monotonic(), 0.0))
    deadline = plan.start_at + plan.duration

    async def worker(n: int) -> None:
        client = Client()
        for k in itertools.count():
            if time.monotonic() >= deadline:
                break
            path = ("routed", "direct")[(n + k) % 2]
            request_id = f"probe-{nonce}-{n}-{k}"
            body = json.dumps(
                {
                    "model": MODEL,
                    "max_tokens": PROBE_MAX_TOKENS,
                    "stream": True,
                    "prompt": make_prompt(shared, f"probe {request_id}", plan.prompt_words),
                }
            ).encode()
            if path == "routed":
                outcome = await client.request(plan.router_port, body, request_id, plan.session)
            else:
                outcome = await client.request(plan.engine_port, body, request_id)
            results.append((path, outcome))
            await asyncio.sleep(gaps.pop())
        client.close()

    await asyncio.gather(worker(0), worker(1))
    return results


def prober(plan: ProbePlan, pipe: Any) -> None:
    """Entry point of the prober process: a client of its own whose event loop is idle
    between probes, so its timestamps are not delayed by the load's 200 streams."""
    pipe.send(run_async(probe_loop(plan)))


@dataclass
class ProbeResult:
    load: Run
    routed: list[float]  # transit (s) of probes through the router
    direct: list[float]  # transit (s) of probes straight to the probe engine
    engine: list[float]  # the probe engine's own TTFT (s)
    failures: int
    cpu: float
    cpu_wait: float
    side: list[float]
    steal: float


def probe_transits(
    results: list[tuple[str, Outcome | None]], probe: ProbeEngine
) -> tuple[list[float], list[float], list[float], int]:
    """Transits (s) of the routed and the direct probes, the probe engine's TTFTs (s) and
    the number of failed probes."""
    paths: dict[str, Run] = {"routed": Run(True), "direct": Run(True)}
    failures = 0
    for path, outcome in results:
        if outcome is None:
            failures += 1
        else:
            paths[path].outcomes.append(outcome)
    engine_ttft = probe.log.engine_ttft(paths["routed"]) | probe.log.engine_ttft(paths["direct"])
    return (
        transit(paths["routed"], engine_ttft),
        transit(paths["direct"], engine_ttft),
        list(engine_ttft.values()),
        failures,
    )
