"""Flow control (router_worker/routing/flow.py): saturation, strict priority between
classes, token-fair release within a class weighted by share, sheds and refusals with the
status that says why, and every request accounted for."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from router_worker.routing.flow import (
    DEFAULT_TENANT,
    FleetLoad,
    FlowController,
    FlowParams,
    FlowRequest,
    Refusal,
    TenantSettings,
)
from router_worker.routing.indicators import Health
from tests.routing.helpers import add_pending, cluster

CALM = FleetLoad(
    healthy=2, pending_tokens=0.0, clear_rate=1000.0, kv_usage=0.1, waiting_per_instance=0
)
# 1900 pending tokens at 1000 tokens/s: one more request of 600 tokens saturates (2 s).
EDGE = FleetLoad(
    healthy=2, pending_tokens=1900.0, clear_rate=1000.0, kv_usage=0.1, waiting_per_instance=0
)
BUSY = FleetLoad(
    healthy=2, pending_tokens=5000.0, clear_rate=1000.0, kv_usage=0.1, waiting_per_instance=0
)


def _request(tenant: str, n: int, priority: str = "standard", tokens: int = 600, at: float = 0.0):
    return FlowRequest(f"{tenant}-{n}", tenant, priority, tokens, 1000, at)


def _flow(*tenants: TenantSettings, **params) -> FlowController:
    """A controller saturated past 2 s of queued prefill (the loads above)."""
    return FlowController(FlowParams(**{"max_backlog_s": 2.0, **params}), tenants)


def test_a_calm_fleet_admits_at_once_and_charges_the_tenant():
    flow = _flow()
    verdict, evicted = flow.offer(_request("a", 1), CALM, 0.0)
    assert verdict == "admit" and evicted == [] and flow.queued == 0
    assert flow.counters()["a"] == 600


@pytest.mark.parametrize(
    ("pending", "kv", "waiting", "saturated"),
    [
        (1000, 0.1, 0, False),
        (2500, 0.1, 0, True),  # 2.5 s of prefill at 1000 tokens/s
        (0, 0.96, 0, True),
        (0, 0.1, 9, True),
    ],
)
def test_saturation_reads_backlog_kv_usage_and_engine_queues(pending, kv, waiting, saturated):
    state = cluster(2, tps=500.0)  # 1000 tokens/s over the fleet
    if pending:
        add_pending(state, "i0", pending)
    state.on_scrape("i0", running=1, waiting=waiting, kv_usage=kv, now=1.0)
    state.on_scrape("i1", running=1, waiting=waiting, kv_usage=kv, now=1.0)
    load = FleetLoad.of(state)
    assert load.healthy == 2 and load.clear_rate == pytest.approx(1000.0)
    assert FlowParams(max_backlog_s=2.0).saturated(load) is saturated


def test_strict_priority_between_classes_whatever_the_arrival_order():
    flow = _flow()
    # A sheddable request is queued (not shed) while others wait on a fleet not saturated.
    order = [("b", "standard", BUSY), ("s", "sheddable", EDGE), ("c", "critical", BUSY)]
    for n, (tenant, priority, load) in enumerate([*order, ("b2", "standard", BUSY)]):
        verdict, _ = flow.offer(_request(tenant, n, priority), load, float(n))
        assert verdict == "queue"
    released = flow.release(CALM, 5.0)
    assert [r.priority for r in released] == ["critical", "standard", "standard", "sheddable"]


def _serve_in_turns(flow: FlowController, rounds: int) -> Counter[str]:
    """Release one request at a time (the fleet saturates again after each)."""
    served: Counter[str] = Counter()
    for _ in range(rounds):
        for request in flow.release(EDGE, 0.0):
            served[request.tenant] += request.input_tokens
            flow.served(request.tenant, 100)
    return served


def test_within_a_class_service_follows_the_share_weights_not_the_demand():
    flow = _flow(TenantSettings(name="heavy", weight=1), TenantSettings(name="light", weight=2))
    for n in range(200):  # heavy floods, light sends a quarter as many
        flow.offer(_request("heavy", n), BUSY, 0.0)
        if n % 4 == 0:
            flow.offer(_request("light", n), BUSY, 0.0)
    served = _serve_in_turns(flow, 60)
    assert sum(served.values()) == 60 * 600
    assert served["light"] / served["heavy"] == pytest.approx(2.0, rel=0.1)


def test_a_tenant_that_starts_waiting_is_lifted_to_the_others_counter():
    flow = _flow()
    for n in range(50):
        flow.offer(_request("a", n), BUSY, 0.0)
    _serve_in_turns(flow, 20)  # a has been served 20 requests
    for n in range(30):
        flow.offer(_request("b", n), BUSY, 0.0)  # b was idle: no credit saved up
    served = _serve_in_turns(flow, 20)
    assert served["a"] == served["b"] == 10 * 600


def test_sheddable_requests_are_shed_first_with_503_and_retry_after():
    flow = _flow(TenantSettings(name="batch", priority="sheddable"))
    verdict, _ = flow.offer(_request("batch", 1, "sheddable"), BUSY, 0.0)
    assert isinstance(verdict, Refusal)
    assert (verdict.status, verdict.reason) == (503, "shed") and verdict.retry_after_s == 5
    assert flow.offer(_request("other", 1), BUSY, 0.0)[0] == "queue"


def test_a_tenants_full_queue_is_429_for_that_tenant_only():
    flow = _flow(TenantSettings(name="a", max_queued=2), TenantSettings(name="b"))
    assert [flow.offer(_request("a", n), BUSY, 0.0)[0] for n in range(2)] == ["queue", "queue"]
    verdict, _ = flow.offer(_request("a", 3), BUSY, 0.0)
    assert isinstance(verdict, Refusal) and (verdict.status, verdict.reason) == (
        429,
        "tenant_queue_full",
    )
    assert flow.offer(_request("b", 1), BUSY, 0.0)[0] == "queue"
    byte_bound = _flow(TenantSettings(name="a", max_queued_bytes=1500))
    assert byte_bound.offer(_request("a", 1), BUSY, 0.0)[0] == "queue"
    assert isinstance(byte_bound.offer(_request("a", 2), BUSY, 0.0)[0], Refusal)


def test_a_full_router_queue_evicts_a_lower_class_or_refuses_the_arrival():
    flow = _flow(max_queued=2)
    flow.offer(_request("b", 1), BUSY, 0.0)
    flow.offer(_request("s", 1, "sheddable"), EDGE, 1.0)  # queued behind b, not shed
    verdict, evicted = flow.offer(_request("c", 1, "critical"), BUSY, 2.0)
    assert verdict == "queue"
    assert [(r.request_id, e.status, e.reason) for r, e in evicted] == [("s-1", 503, "evicted")]
    verdict, evicted = flow.offer(_request("b", 2), BUSY, 3.0)
    assert isinstance(verdict, Refusal) and (verdict.status, verdict.reason) == (503, "queue_full")
    assert evicted == [] and flow.queued == 2


def test_a_header_may_lower_the_class_never_raise_it():
    flow = _flow(TenantSettings(name="a", priority="standard"))
    assert flow.priority_of("a", "sheddable") == "sheddable"
    assert flow.priority_of("a", "critical") == "standard"
    assert flow.priority_of("a", None) == "standard"
    assert flow.priority_of("unknown", "critical") == "standard"  # the default tenant's


def test_a_request_waiting_too_long_is_refused_with_503():
    flow = _flow(queue_timeout_s=10)
    flow.offer(_request("a", 1, at=0.0), BUSY, 0.0)
    flow.offer(_request("a", 2, at=5.0), BUSY, 5.0)
    assert flow.expire(9.0, BUSY) == []
    expired = flow.expire(10.0, BUSY)
    assert [(r.request_id, e.status, e.reason) for r, e in expired] == [
        ("a-1", 503, "queue_timeout")
    ]
    assert flow.queued == 1


def test_a_tenant_removed_while_its_requests_wait_loses_none_of_them():
    flow = _flow(TenantSettings(name="gone", weight=5))
    for n in range(3):
        flow.offer(_request("gone", n), BUSY, 0.0)
    flow.configure(FlowParams(max_backlog_s=2.0), [])
    assert flow.settings("gone").name == DEFAULT_TENANT
    assert [r.request_id for r in flow.release(CALM, 1.0)] == ["gone-0", "gone-1", "gone-2"]


def test_disabled_flow_control_admits_everything():
    flow = _flow(enabled=False)
    assert all(flow.offer(_request("a", n), BUSY, 0.0)[0] == "admit" for n in range(5))


def test_every_request_is_admitted_released_refused_or_still_waiting():
    """Random arrivals, loads, releases, timeouts and cancellations: none is lost."""
    rng = random.Random(7)
    flow = _flow(
        TenantSettings(name="a", max_queued=5),
        TenantSettings(name="b", priority="critical"),
        TenantSettings(name="c", priority="sheddable"),
        max_queued=12,
        queue_timeout_s=20,
    )
    fate: dict[str, str] = {}
    waiting: dict[str, FlowRequest] = {}
    loads = (CALM, EDGE, BUSY)
    for step in range(2000):
        now = step * 0.1
        load = rng.choice(loads)
        tenant = rng.choice("abc")
        request = _request(tenant, step, flow.settings(tenant).priority, rng.randint(1, 900), now)
        verdict, evicted = flow.offer(request, load, now)
        fate[request.request_id] = "refused" if isinstance(verdict, Refusal) else verdict
        if verdict == "queue":
            waiting[request.request_id] = request
        for gone, _ in evicted + flow.expire(now, load):
            fate[gone.request_id] = "refused"
            del waiting[gone.request_id]
        for released in flow.release(rng.choice(loads), now):
            fate[released.request_id] = "released"
            del waiting[released.request_id]
        if waiting and rng.random() < 0.05:
            victim = waiting.pop(rng.choice(sorted(waiting)))
            assert flow.cancel(victim)
            fate[victim.request_id] = "cancelled"
    assert len(fate) == 2000 and flow.queued == len(waiting) == sum(flow.waiting().values())
    assert set(fate.values()) >= {"admit", "released", "refused"}
    assert all(fate[r] == "queue" for r in waiting)


def test_the_router_queue_must_leave_concurrency_slots_for_requests_in_flight():
    from router_worker.contract.config import ConfigError, parse_config

    document = {
        "instances": [{"name": "i0", "url": "http://127.0.0.1:1"}],
        "policy": {"kind": "least_load"},
        "flow": {"enabled": True, "max_queued": 1024},
    }
    with pytest.raises(ConfigError, match=r"flow.max_queued \(1024\) must be below"):
        parse_config(document)
    assert parse_config({**document, "router": {"max_concurrency": 2048}}).flow.max_queued == 1024
    assert parse_config({**document, "flow": {"enabled": False, "max_queued": 1024}})


def test_flow_control_is_on_by_default_only_where_the_document_lists_tenants():
    """One tenant has nobody to be fair between: a router run from a file and a cluster
    without tenants alike send every request on at once; listing tenants turns it on, and
    an explicit setting wins either way."""
    from router_worker.contract.config import parse_config

    document = {
        "instances": [{"name": "i0", "url": "http://127.0.0.1:1"}],
        "policy": {"kind": "least_load"},
    }
    tenants = {"tenants": [{"name": "team-a"}]}
    assert not parse_config(document).flow.enabled
    assert parse_config({**document, **tenants}).flow.enabled
    assert parse_config({**document, "flow": {"enabled": True}}).flow.enabled
    assert not parse_config({**document, **tenants, "flow": {"enabled": False}}).flow.enabled
    # settings without `enabled` follow the tenants too
    assert not parse_config({**document, "flow": {"max_backlog_s": 2}}).flow.enabled


def test_a_document_without_flow_settings_still_parses_on_a_router_with_few_slots():
    """Documents stored before flow control (and small routers) name no flow.max_queued:
    its default is fitted to half the router's slots instead of refusing the document."""
    from router_worker.contract.config import parse_config

    document = {
        "instances": [{"name": "i0", "url": "http://127.0.0.1:1"}],
        "policy": {"kind": "least_load"},
        "router": {"max_concurrency": 10},
        "tenants": [{"name": "team-a"}],  # flow control on
    }
    assert parse_config(document).flow.max_queued == 5
    one_slot = {**document, "router": {"max_concurrency": 1}}
    assert parse_config(one_slot).flow.max_queued == 0
    assert parse_config({**document, "router": {"max_concurrency": 4096}}).flow.max_queued == 512


# ----- the TPOT leg ------------------------------------------------------------------


def _scraped(*intervals: tuple[float, float], health=None):
    """Two instances scraped twice: ``intervals`` gives each one's (ITL sum, tokens) of
    the interval between the scrapes."""
    state = cluster(len(intervals), tps=500.0)
    for k, (total, count) in enumerate(intervals):
        state.on_scrape(f"i{k}", 0.0, itl_totals=(10.0, 100.0))
        state.on_scrape(f"i{k}", 1.0, itl_totals=(10.0 + total, 100.0 + count))
    return state


def test_the_step_time_is_the_token_weighted_mean_inter_token_latency_of_the_last_interval():
    state = _scraped((3.0, 100.0), (1.0, 100.0))  # 30 ms and 10 ms a token
    assert FleetLoad.of(state).step_s == pytest.approx(0.02)
    state.set_health("i0", Health.DRAINING)  # healthy instances only
    assert FleetLoad.of(state).step_s == pytest.approx(0.01)
    # A first scrape knows no interval; an engine whose counters went back (a restart)
    # neither; an engine that produced no token adds none.
    fresh = cluster(2, tps=500.0)
    fresh.on_scrape("i0", 0.0, itl_totals=(5.0, 50.0))
    assert math.isnan(FleetLoad.of(fresh).step_s)
    state.set_health("i0", Health.HEALTHY)
    state.on_scrape("i0", 2.0, itl_totals=(0.5, 10.0))  # restarted
    state.on_scrape("i1", 2.0, itl_totals=(11.0 + 2.0, 200.0 + 100.0))
    assert FleetLoad.of(state).step_s == pytest.approx(0.02)  # i1's alone
    state.on_scrape("i0", 3.0, itl_totals=(0.5 + 4.0, 10.0 + 100.0))
    state.on_scrape("i1", 3.0, itl_totals=(13.0, 300.0))  # idle: the same counters
    assert FleetLoad.of(state).step_s == pytest.approx(0.04)


def _load(backlog_s: float, step_s: float) -> FleetLoad:
    return FleetLoad(2, backlog_s * 1000.0, 1000.0, 0.1, 0.0, step_s)


def test_over_target_the_backlog_bound_shrinks_by_the_overshoot_under_it_grows_back():
    # SLO 0.1 s, target 0.5: 50 ms. Over it the bound is multiplied by target ÷ step time
    # every backlog_halving_s (halved at twice the target); under it, it grows linearly.
    flow = _flow(tpot_slo_s=0.1, tpot_target=0.5, backlog_growth=0.1)
    assert flow.bound_s == 2.0
    flow.adapt(_load(0.0, 0.1), 0.0)  # the first reading only starts the clock
    assert flow.bound_s == 2.0
    flow.adapt(_load(0.0, 0.1), 1.0)  # twice the target for a second: halved
    assert flow.bound_s == pytest.approx(1.0)
    flow.adapt(_load(0.0, 0.2), 2.0)  # four times: quartered
    assert flow.bound_s == pytest.approx(0.25)
    flow.adapt(_load(0.0, 0.05), 3.0)  # at the target: kept
    assert flow.bound_s == pytest.approx(0.25)
    flow.adapt(_load(0.0, 0.03), 5.0)  # + 2.0 × 0.1 a second
    assert flow.bound_s == pytest.approx(0.65)
    flow.adapt(_load(0.0, math.nan), 6.0)  # no token measured: nothing to protect
    assert flow.bound_s == pytest.approx(0.85)
    flow.adapt(_load(0.0, 0.03), 60.0)
    assert flow.bound_s == 2.0  # never past max_backlog_s


def test_the_adapted_bound_decides_saturation_and_admission():
    flow = _flow(tpot_slo_s=0.1, tpot_target=0.8)  # target 80 ms
    slow = _load(1.5, 0.2)  # 1.5 s of prefill queued, under max_backlog_s (2 s)
    assert flow.offer(_request("a", 1), slow, 0.0)[0] == "admit"
    assert flow.offer(_request("a", 2), slow, 1.0)[0] == "queue"  # the bound is 0.8 s now
    assert flow.saturated(slow) and not flow.params.saturated(slow)
    assert flow.release(_load(1.5, 0.01), 2.0) == []  # 1.0 s: still under the backlog
    assert [r.request_id for r in flow.release(_load(0.0, 0.01), 3.0)] == ["a-2"]


@pytest.mark.parametrize(
    ("slo_s", "bound"), [(0.05, 2 * 0.04 / 0.09), (0.1, 2 * 0.08 / 0.09), (0.2, 2.0)]
)
def test_the_leg_follows_the_tpot_slo(slo_s, bound):
    # The same engines (90 ms a token) are over the target of a 50 ms SLO (40 ms) by more
    # than over a 100 ms one's (80 ms), and under a 200 ms one's.
    flow = _flow(tpot_slo_s=slo_s, tpot_target=0.8)
    flow.adapt(_load(0.0, 0.09), 0.0)
    flow.adapt(_load(0.0, 0.09), 1.0)
    assert flow.bound_s == pytest.approx(bound)


def test_the_bound_stays_put_without_a_tpot_slo_starts_at_the_max_and_carries_over_with_one():
    flow = _flow()
    for now in range(5):
        flow.offer(_request("a", now), _load(0.0, 5.0), float(now))
    assert flow.bound_s == 2.0
    flow.configure(FlowParams(max_backlog_s=0.25, tpot_slo_s=0.1, tpot_target=0.8), [])
    assert flow.bound_s == 0.25
    flow.adapt(_load(0.0, 0.16), 10.0)
    flow.adapt(_load(0.0, 0.16), 11.0)
    assert flow.bound_s == pytest.approx(0.125)
    flow.configure(FlowParams(max_backlog_s=0.2, tpot_slo_s=0.1), [])  # kept, within 0.2
    assert flow.bound_s == pytest.approx(0.125)
    flow.configure(FlowParams(max_backlog_s=1.0), [])  # the leg off: the fixed bound
    assert flow.bound_s == 1.0
    flow.configure(FlowParams(max_backlog_s=3.0, tpot_slo_s=0.1), [])  # on again: from max
    assert flow.bound_s == 3.0
