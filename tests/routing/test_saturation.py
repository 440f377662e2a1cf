"""The fleet's saturation (the autoscaling signal) from a hand-built cluster state: queued
prefill seconds per healthy instance and the engines' mean KV usage."""

from __future__ import annotations

import pytest

from router_worker.routing import Health
from router_worker.routing.saturation import Saturation, fleet_saturation
from tests.routing.helpers import add_pending, cluster


def test_pending_prefill_seconds_are_the_mean_over_healthy_instances() -> None:
    state = cluster(4, tps=1_000.0)
    add_pending(state, "i0", 3_000)  # 3 s of prefill queued
    add_pending(state, "i1", 1_000)  # 1 s
    add_pending(state, "i3", 8_000)  # down: not counted
    state.set_health("i3", Health.DOWN)
    saturation = fleet_saturation(state.view())
    assert saturation.instances == 3
    assert saturation.pending_prefill_s == pytest.approx((3.0 + 1.0 + 0.0) / 3)


def test_kv_pressure_averages_what_the_engines_reported() -> None:
    state = cluster(3)
    assert fleet_saturation(state.view()).kv_pressure == 0.0  # nothing scraped yet
    state.on_scrape("i0", 1.0, kv_usage=0.9)
    state.on_scrape("i1", 1.0, kv_usage=0.5)
    assert fleet_saturation(state.view()).kv_pressure == pytest.approx(0.7)


def test_adding_instances_lowers_the_signal() -> None:
    small, large = cluster(2, tps=1_000.0), cluster(4, tps=1_000.0)
    for state in (small, large):
        add_pending(state, "i0", 4_000)
    assert (
        fleet_saturation(large.view()).pending_prefill_s
        < fleet_saturation(small.view()).pending_prefill_s
    )


def test_a_fleet_with_no_healthy_instance_reads_zero() -> None:
    state = cluster(1)
    state.set_health("i0", Health.DOWN)
    assert fleet_saturation(state.view()) == Saturation(0, 0.0, 0.0)
