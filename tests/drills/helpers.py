"""What the drills share: a router configuration for fast failure detection."""

from __future__ import annotations

from typing import Any

from devharness import Fleet

# Fast failure detection: what an operator would configure for a latency-sensitive fleet.
DRILL_ROUTER = {
    "scrape_interval_s": 0.2,
    "health_interval_s": 0.2,
    "breaker_open_s": 0.5,
    "connect_timeout_s": 0.3,
    "first_byte_timeout_s": 1.0,
    "kv_events": False,
}


def drill_config(fleet: Fleet, kind: str = "lmetric", **router: Any) -> dict[str, Any]:
    return {
        "cluster": "drill",
        "model": "Qwen/Qwen2-7B-Instruct",
        "instances": fleet.instances(),
        "policy": {"kind": kind, "params": {}},
        "router": {**DRILL_ROUTER, **router},
    }
