"""What the drills share: a router configuration for fast failure detection, and traffic
and operator actions against a running router (a hot-prefix burst, steady background
load, draining an instance)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx

from devharness import Fleet, Router
from tests.drills.clients import MODEL, Load
from tests.drills.report import Outcome

# Fast failure detection: what an operator would configure for a latency-sensitive fleet.
DRILL_ROUTER = {
    "scrape_interval_s": 0.2,
    "health_interval_s": 0.2,
    "breaker_open_s": 0.5,
    "connect_timeout_s": 0.3,
    "first_byte_timeout_s": 1.0,
    "kv_events": False,
}
HOT_PREFIX = " ".join(f"shared-system-prompt-{i}" for i in range(200))


def drill_config(fleet: Fleet, kind: str = "lmetric", **router: Any) -> dict[str, Any]:
    return {
        "cluster": "drill",
        "model": "Qwen/Qwen2-7B-Instruct",
        "instances": fleet.instances(),
        "policy": {"kind": kind, "params": {}},
        "router": {**DRILL_ROUTER, **router},
    }


def hot_burst(router: Router, count: int = 60) -> Outcome:
    """Many requests behind one long shared prefix: LMetric's hotspot detector trips."""
    outcome = Outcome()

    async def run() -> None:
        gate = asyncio.Semaphore(2)
        async with httpx.AsyncClient(timeout=30, trust_env=False) as client:

            async def one(k: int) -> None:
                async with gate:
                    body = {
                        "model": MODEL,
                        "prompt": f"{HOT_PREFIX} question {k}",
                        "max_tokens": 30,
                    }
                    response = await client.post(router.url + "/v1/completions", json=body)
                    outcome.add(
                        "ok" if response.status_code == 200 else "lost", response.text[:200]
                    )

            await asyncio.gather(*(one(k) for k in range(count)))

    asyncio.run(run())
    return outcome


def background_load(router: Router, stop: threading.Event, box: list[Outcome]) -> threading.Thread:
    load = Load(router.url + "/v1/completions", concurrency=1, max_tokens=8, pause_s=0.1)
    thread = threading.Thread(
        target=lambda: box.append(asyncio.run(load.run(until=stop.is_set))), daemon=True
    )
    thread.start()
    return thread


def drain(router: Router, name: str, on: bool) -> None:
    action = "drain" if on else "undrain"
    httpx.post(
        f"{router.url}/admin/instances/{name}/{action}", headers=router.admin_headers, timeout=5
    ).raise_for_status()
