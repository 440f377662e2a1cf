"""Flow control's refusals are summarised per tenant and reason, one telemetry event per
interval (the control plane turns it into one audit row), not one per request; its lanes
on the live view count the last window, per tenant and class."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from router_worker.contract.config import parse_config
from router_worker.errors import BackOff
from router_worker.flow_gate import FlowGate, RequestClass
from router_worker.metrics import RouterMetrics
from router_worker.telemetry import WINDOW_S


def test_refusals_are_counted_per_tenant_and_reported_once_per_interval():
    events: list[tuple[str, dict]] = []
    gate = FlowGate(
        RouterMetrics(), lambda: None, lambda kind, **payload: events.append((kind, payload))
    )
    gate.configure(
        parse_config(
            {
                "instances": [{"name": "i0", "url": "http://127.0.0.1:1"}],
                "policy": {"kind": "least_load"},
                "tenants": [{"name": "metered", "requests_per_minute": 1}],
            }
        )
    )

    async def run() -> list[int]:
        statuses = []
        for _ in range(4):
            try:
                await gate.admit(RequestClass("metered"), 10, 100)
                statuses.append(200)
            except BackOff as refused:
                statuses.append(refused.status)
        gate.summarise()
        gate.summarise()  # nothing new: no second event
        return statuses

    assert asyncio.run(run()) == [200, 429, 429, 429]
    assert len(events) == 1
    kind, payload = events[0]
    assert kind == "flow_refusals" and payload["tenants"] == {"metered": {"quota": 3}}
    assert payload["interval_s"] >= 0
    gate.ended("metered", "standard", 110, 0.5, 0.02)
    lane = gate.lanes()["metered"]
    assert (lane.admitted, lane.refused, lane.shed, lane.requests, lane.queued) == (1, 3, 0, 1, 0)
    assert (lane.served_tokens, lane.ttft_p50_s, lane.priority) == (110, 0.5, "standard")


def test_lanes_count_the_last_window_not_since_the_router_started():
    gate = FlowGate(RouterMetrics(), lambda: None)
    gate.configure(
        parse_config(
            {
                "instances": [{"name": "i0", "url": "http://127.0.0.1:1"}],
                "policy": {"kind": "least_load"},
                "tenants": [{"name": "t", "requests_per_minute": 2}],
            }
        )
    )

    async def run() -> None:
        for _ in range(3):
            with contextlib.suppress(BackOff):
                await gate.admit(RequestClass("t"), 10, 100)

    asyncio.run(run())
    gate.ended("t", "standard", 100, 0.4, 0.02)
    gate.ended("t", "sheddable", 50, 2.0, 0.05)  # one that lowered its class
    gate.ended("t", "sheddable", 50, 4.0, None)
    now = time.time()
    lane = gate.lanes(now)["t"]
    assert (lane.admitted, lane.refused, lane.requests, lane.served_tokens) == (2, 1, 3, 200)
    assert lane.ttft_p50_s == 2.0
    assert lane.classes["standard"].model_dump() == {
        "requests": 1,
        "ttft_p50_s": 0.4,
        "tpot_p50_s": 0.02,
    }
    assert lane.classes["sheddable"].model_dump() == {
        "requests": 2,
        "ttft_p50_s": 3.0,
        "tpot_p50_s": 0.05,
    }
    # Still there at the window's end, gone once it has passed, counts and all.
    assert gate.lanes(now + WINDOW_S - 1.5)["t"].requests == 3
    assert gate.lanes(now + WINDOW_S + 1.0) == {}
    assert gate.lanes(now) == {}  # forgotten, not only hidden


@pytest.mark.parametrize("value", ["vip", "", "CRITICAL"])
def test_a_priority_header_outside_the_classes_is_refused(value):
    gate = FlowGate(RouterMetrics(), lambda: None)
    with pytest.raises(Exception, match="x-switchyard-priority must be one of"):
        gate.classify("default", {"x-switchyard-priority": value})
