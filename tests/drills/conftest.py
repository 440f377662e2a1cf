"""Drill fixtures: the suite's shared enginesim fleet of four (tests/conftest.py, with the
routers in front of it) and a private Redis. Every process is stopped in teardown. Their
helpers: tests/drills/helpers.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devharness import Fleet
from tests.router.helpers import PrivateRedis, private_redis_server


@pytest.fixture(scope="session")
def drill_fleet(fleet: Fleet) -> Fleet:
    """The suite's shared fleet; each drill recovers the faults it injects."""
    return fleet


@pytest.fixture
def drill_redis() -> Iterator[PrivateRedis]:
    """A throwaway redis-server: the machine's shared one is never stopped."""
    with private_redis_server("sy-drill-redis-") as server:
        yield server
