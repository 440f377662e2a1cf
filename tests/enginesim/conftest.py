"""Fixtures for the tests of enginesim's HTTP server: real fleets (tests/fleets.py) on loopback."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from devharness import Fleet
from tests.fleets import fast_fleet


@pytest.fixture(scope="session")
def sim() -> Iterator[Fleet]:
    """Four instances shared by the test modules: 0 API, 1 metrics, 2 KV events, 3 faults."""
    with fast_fleet(4, kv_events=True) as fleet:
        yield fleet


@pytest.fixture
def sim_factory() -> Iterator[Callable[..., Fleet]]:
    """Start extra fleets with other server flags (``Fleet``'s ``extra``); stopped after the
    test."""
    started: list[Fleet] = []

    def factory(*extra: str, instances: int = 1, kv_events: bool = True) -> Fleet:
        fleet = fast_fleet(instances, kv_events=kv_events, extra=extra)
        started.append(fleet)
        return fleet.start()

    yield factory
    for fleet in started:
        fleet.stop()
