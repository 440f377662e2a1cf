"""The live view's per-tenant lanes: each router's flow-control counts per tenant over its
recent window, merged over the routers (sums, the newest config's class and weight, TTFT
weighted by requests, class by class), with each tenant's share of the tokens served
against its weight's share."""

from __future__ import annotations

import pytest

from controlplane.realtime.snapshot import merge_cluster
from router_worker.contract.telemetry import ClassLane, TenantLane
from tests.web.helpers import instance, snapshot


def _lane(**values) -> TenantLane:
    base = dict(
        priority="standard",
        weight=1.0,
        requests=0,
        admitted=0,
        queued=0,
        refused=0,
        served_tokens=0.0,
    )
    return TenantLane(**{**base, **values})


def test_lanes_are_summed_over_routers_with_shares_against_weights():
    old = snapshot(
        "c",
        "r1",
        [instance("i0")],
        version=1,
        tenants={
            "a": _lane(
                requests=10, admitted=12, queued=1, refused=3, served_tokens=3000.0, ttft_p50_s=1.0
            ),
            "b": _lane(requests=5, admitted=5, served_tokens=1000.0, ttft_p50_s=0.2),
        },
    )
    new = snapshot(
        "c",
        "r2",
        [instance("i0")],
        version=2,
        tenants={
            "a": _lane(
                priority="critical",
                weight=3.0,
                requests=30,
                admitted=30,
                queued=2,
                served_tokens=9000.0,
                ttft_p50_s=2.0,
            ),
        },
    )
    lanes = merge_cluster("c", [new, old])["tenants"]
    a, b = lanes["a"], lanes["b"]
    assert (a["priority"], a["weight"]) == ("critical", 3.0)  # the newest config's
    assert (a["requests"], a["admitted"], a["queued"], a["refused"]) == (40, 42, 3, 3)
    assert a["ttft_p50_s"] == pytest.approx((10 * 1.0 + 30 * 2.0) / 40)
    assert a["share"] == pytest.approx(12000 / 13000) and b["share"] == pytest.approx(1 / 13)
    assert a["weight_share"] == pytest.approx(0.75) and b["weight_share"] == pytest.approx(0.25)


def test_no_lanes_without_flow_control_reports():
    assert merge_cluster("c", [snapshot("c", "r1", [instance("i0")])])["tenants"] == {}


def test_each_class_of_a_tenant_merges_over_the_routers_and_sheds_add_up():
    first = snapshot(
        "c",
        "r1",
        [instance("i0")],
        tenants={
            "a": _lane(
                requests=3,
                refused=4,
                shed=3,
                classes={
                    "standard": ClassLane(requests=1, ttft_p50_s=0.2, tpot_p50_s=0.01),
                    "sheddable": ClassLane(requests=2, ttft_p50_s=3.0, tpot_p50_s=None),
                },
            )
        },
    )
    second = snapshot(
        "c",
        "r2",
        [instance("i0")],
        tenants={
            "a": _lane(
                requests=3,
                refused=1,
                shed=1,
                classes={"standard": ClassLane(requests=3, ttft_p50_s=0.6, tpot_p50_s=0.03)},
            )
        },
    )
    a = merge_cluster("c", [first, second])["tenants"]["a"]
    assert (a["refused"], a["shed"]) == (5, 4)
    assert list(a["classes"]) == ["standard", "sheddable"]  # by rank
    standard, sheddable = a["classes"]["standard"], a["classes"]["sheddable"]
    assert standard["requests"] == 4
    assert standard["ttft_p50_s"] == pytest.approx((0.2 + 3 * 0.6) / 4)
    assert standard["tpot_p50_s"] == pytest.approx((0.01 + 3 * 0.03) / 4)
    assert sheddable == {"requests": 2, "ttft_p50_s": 3.0, "tpot_p50_s": None}
