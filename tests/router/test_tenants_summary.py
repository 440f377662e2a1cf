"""Flow control's refusals are summarised per tenant and reason, one telemetry event per
interval (the control plane turns it into one audit row), not one per request."""

from __future__ import annotations

import asyncio

import pytest

from router_worker.contract.config import parse_config
from router_worker.errors import BackOff
from router_worker.flow_gate import FlowGate, RequestClass
from router_worker.metrics import RouterMetrics


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
    gate.ended("metered", 110, 0.5, 0.02)
    lane = gate.lanes()["metered"]
    assert (lane.admitted, lane.refused, lane.requests, lane.queued) == (1, 3, 1, 0)
    assert (lane.served_tokens, lane.ttft_p50_s, lane.priority) == (110, 0.5, "standard")


@pytest.mark.parametrize("value", ["vip", "", "CRITICAL"])
def test_a_priority_header_outside_the_classes_is_refused(value):
    gate = FlowGate(RouterMetrics(), lambda: None)
    with pytest.raises(Exception, match="x-switchyard-priority must be one of"):
        gate.classify("default", {"x-switchyard-priority": value})
