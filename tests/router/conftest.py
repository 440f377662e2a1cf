"""Router test fixtures: routers on loopback in front of the suite's shared fleet
(``fleet``, tests/conftest.py), and a private Redis. Their helpers: tests/router/helpers.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.router.helpers import PrivateRedis, private_redis_server


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    """A throwaway redis-server (never the machine's shared one: others' tests use it)."""
    with private_redis_server() as server:
        yield server
