"""The router's flow control in replay (enginesim.replay.simulator runs
router_worker.routing.flow and .quota): traces carry a tenant and a priority; under
overload a compliant tenant keeps its latency where first-come-first-served loses it,
the critical class goes first, and every request is served or refused with a reason."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping

import numpy as np
import pytest

from enginesim.replay.metrics import tpot_of
from enginesim.replay.simulator import SimConfig, Simulator
from enginesim.replay.traces import TraceRecord, read_bailian_rows
from router_worker.routing.flow import FlowParams, TenantSettings

TENANTS = (TenantSettings(name="light"), TenantSettings(name="heavy"))


def workload(rates: Mapping[str, tuple[float, str | None]], duration: float = 40.0):
    """Poisson arrivals per tenant: 2000-token prompts, 100-token answers."""
    rng = random.Random(0)
    events = []
    for tenant, (rate, priority) in rates.items():
        t = rng.expovariate(rate)
        while t < duration:
            events.append((t, tenant, priority))
            t += rng.expovariate(rate)
    events.sort()
    return [
        TraceRecord(k, t, 2000, 100, tenant=tenant, priority=priority)
        for k, (t, tenant, priority) in enumerate(events)
    ]


def replay(records, flow: FlowParams | None, tenants=TENANTS):
    config = SimConfig(instances=2, flow=flow, tenants=tenants)
    return Simulator(records, "least_load", config).run().requests


def p90_ttft(requests, tenant: str, records) -> float:
    """A tenant's p90 TTFT over its served requests (the trace says whose each one is)."""
    of = {f"r{r.index}": r.tenant for r in records}
    ttfts = [
        r.first_token_s - r.arrival_s
        for r in requests
        if r.status == "ok" and of[r.id] == tenant and r.first_token_s is not None
    ]
    return float(np.percentile(ttfts, 90))


# The fleet clears about 6.6 of these requests a second: heavy alone overloads it.
OVERLOAD: dict[str, tuple[float, str | None]] = {"light": (2.0, None), "heavy": (10.0, None)}


def test_a_compliant_tenant_keeps_its_latency_under_another_tenants_flood():
    records = workload(OVERLOAD)
    fcfs = replay(records, None)
    flow = replay(records, FlowParams())
    assert p90_ttft(flow, "light", records) < 0.25 * p90_ttft(fcfs, "light", records)
    assert all(r.status == "ok" for r in flow if r.tenant == "light")


def test_every_request_is_served_or_refused_with_a_reason():
    records = workload(OVERLOAD)
    requests = replay(records, FlowParams(queue_timeout_s=5))
    assert len(requests) == len(records)
    statuses = {r.status for r in requests}
    assert statuses <= {"ok", "shed", "throttled"} and "shed" in statuses
    assert all(r.refusal == "queue_timeout" for r in requests if r.status == "shed")
    assert all(r.finish_s is not None for r in requests)
    waited = [r for r in requests if r.status == "ok" and r.queued_s > 0]
    assert waited and all(r.first_token_s - r.arrival_s >= r.queued_s for r in waited)


def test_the_critical_class_goes_first_and_sheddable_requests_are_shed():
    records = workload({"light": (2.0, "critical"), "heavy": (10.0, "sheddable")})
    tenants = (
        TenantSettings(name="light", priority="critical"),
        TenantSettings(name="heavy"),
    )
    requests = replay(records, FlowParams(), tenants)
    assert p90_ttft(requests, "light", records) < p90_ttft(replay(records, None), "light", records)
    heavy = [r for r in requests if r.tenant == "heavy"]
    assert {r.priority for r in heavy} == {"sheddable"}  # the trace lowered it
    assert any(r.status == "shed" and r.refusal == "shed" for r in heavy)


def test_quotas_hold_in_replay():
    records = workload({"light": (5.0, None)}, duration=60.0)
    limited = (TenantSettings(name="light", requests_per_minute=120),)
    requests = replay(records, FlowParams(), limited)
    served = sum(r.status == "ok" for r in requests)
    assert served <= 120 and served + sum(r.status == "throttled" for r in requests) == len(
        requests
    )
    assert {r.refusal for r in requests if r.status == "throttled"} == {"quota"}


def test_a_shed_request_does_not_count_against_its_tenants_quota_in_replay():
    """A sheddable tenant overloading the fleet alone: what is shed gives its quota charge
    back, so the tenant is throttled only once it was served its whole limit."""
    limit = 400
    records = workload({"batch": (10.0, None)}, duration=59.0)  # one minute window
    tenants = (TenantSettings(name="batch", priority="sheddable", requests_per_minute=limit),)
    requests = replay(records, FlowParams(), tenants)
    fates = {status: sum(r.status == status for r in requests) for status in ("ok", "shed")}
    throttled = sum(r.status == "throttled" for r in requests)
    assert fates["shed"] > 0 and fates["ok"] <= limit
    assert throttled == 0 or fates["ok"] == limit, (fates, throttled)


def test_the_same_trace_and_seed_give_the_same_fates():
    records = workload(OVERLOAD, duration=20.0)
    first = [r.to_json() for r in replay(records, FlowParams())]
    assert first == [r.to_json() for r in replay(records, FlowParams())]


def test_a_trace_carries_tenant_and_priority_and_bad_ones_are_refused():
    row = {"chat_id": 1, "timestamp": 0.0, "input_length": 100, "output_length": 5}
    (record,) = read_bailian_rows([{**row, "tenant": "team-a", "priority": "sheddable"}])
    assert (record.tenant, record.priority) == ("team-a", "sheddable")
    (bad,) = read_bailian_rows([{**row, "priority": "vip"}])
    with pytest.raises(ValueError, match="priority must be one of"):
        Simulator([bad], "least_load", SimConfig(instances=1, flow=FlowParams()))


def _trace_file(tmp_path, records) -> str:
    path = tmp_path / "tenants.jsonl"
    rows = [
        {
            "timestamp": int(r.arrival_s * 1000),
            "input_length": r.input_tokens,
            "output_length": r.output_tokens,
            "hash_ids": [],
            "tenant": r.tenant,
        }
        for r in records
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_the_replay_command_runs_flow_control_and_asks_what_if_a_tenant_doubles(tmp_path):
    from enginesim.__main__ import main

    trace = _trace_file(tmp_path, workload({"light": (1.0, None), "heavy": (2.0, None)}, 20.0))
    tenants = json.dumps([{"name": "light"}, {"name": "heavy", "priority": "sheddable"}])

    def run(out: str, *extra: str) -> dict:
        argv = ["replay", "--trace", trace, "--instances", "2", "--policy", "least_load"]
        argv += ["--flow", "{}", "--tenants", tenants, "--out", str(tmp_path / out)]
        assert main([*argv, "--no-plots", "--no-progress", *extra]) == 0
        summary = json.loads((tmp_path / out / "results.json").read_text())[0]
        return summary["tenants"]

    base = run("base")
    doubled = run("doubled", "--tenant-scale", "heavy=2")
    assert doubled["heavy"]["requests"] == 2 * base["heavy"]["requests"]
    assert doubled["light"]["requests"] == base["light"]["requests"]
    for tenant in ("light", "heavy"):
        fates = doubled[tenant]
        assert fates["served"] + fates["throttled"] + fates["shed"] == fates["requests"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--flow", '{"max_backlog_s": -1}'], "max_backlog_s"),
        (["--flow", "{}", "--tenants", '[{"name": "x", "weight": 0}]'], "weight"),
        (["--tenants", '[{"name": "x"}]'], "--tenants needs --flow"),
        (["--flow", "{", "--tenants", "[]"], "not JSON"),
        (["--tenant-scale", "heavy=lots"], "--tenant-scale"),
    ],
)
def test_the_replay_command_refuses_bad_flow_flags_naming_them(tmp_path, flags, message):
    from enginesim.__main__ import main

    trace = _trace_file(tmp_path, workload({"light": (1.0, None)}, 5.0))
    argv = ["replay", "--trace", trace, "--instances", "1", "--policy", "least_load"]
    with pytest.raises(SystemExit, match=message):
        main([*argv, "--out", str(tmp_path / "out"), "--no-plots", *flags])


def test_the_tpot_leg_keeps_the_admitted_requests_within_the_tpot_slo():
    # Under overload the engines prefill in every step: whatever the backlog bound, the
    # requests admitted decode slowly. With the TPOT SLO set, flow control reads the step
    # time the engines report (their inter-token latency, scraped) and admits less.
    records = workload(OVERLOAD, duration=30.0)

    def tpots(flow: FlowParams) -> np.ndarray:
        done = [r for r in replay(records, flow) if r.status == "ok"]
        return np.array([tpot_of(r) for r in done])

    without, with_leg = tpots(FlowParams()), tpots(FlowParams(tpot_slo_s=0.1))
    assert np.mean(without > 0.1) > 0.5
    assert np.mean(with_leg <= 0.1) > 0.95
