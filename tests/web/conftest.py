"""Fixtures for the web UI and realtime tests: users of each role, a cluster built through
the services, Redis, and real server processes (uvicorn ASGI app, the publisher). Their
helpers: tests/web/helpers.py."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import redis
from django.conf import settings
from django.test import Client

from controlplane.models import Cluster
from devharness import free_port, stop_process
from tests.web.helpers import Server, make_cluster, make_user, start_asgi, start_process


@pytest.fixture
def users(db) -> dict:
    return {role: make_user(role) for role in ("viewer", "operator", "admin")}


@pytest.fixture
def as_role(users):
    def client(role: str | None) -> Client:
        c = Client()
        if role is not None:
            c.force_login(users[role])
        return c

    return client


@pytest.fixture
def cluster(db) -> Cluster:
    return make_cluster()


@pytest.fixture
def redis_client() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.REDIS_URL)
    yield client
    client.close()


@pytest.fixture(scope="module")
def shared_asgi(django_db_setup, tmp_path_factory) -> Iterator[Server]:
    """One uvicorn per test module: it reads the test database per request, so tests can
    share it while each one starts from a flushed database."""
    server = start_asgi(free_port(), tmp_path_factory.mktemp("asgi") / "uvicorn.log")
    yield server
    stop_process(server.process)


@pytest.fixture
def asgi_server(shared_asgi, transactional_db) -> Server:
    if shared_asgi.process.poll() is not None:
        raise RuntimeError(f"uvicorn died:\n{shared_asgi.log.read_text()[-3000:]}")
    return shared_asgi


@pytest.fixture
def own_asgi_server(transactional_db, tmp_path) -> Iterator[Server]:
    """A uvicorn of the test's own, for tests that stop and restart it."""
    server = start_asgi(free_port(), tmp_path / "uvicorn.log")
    yield server
    stop_process(server.process)


@pytest.fixture
def publisher(transactional_db, tmp_path) -> Iterator[subprocess.Popen]:
    """`manage.py run_publisher` as its own process, as `make demo` runs it."""
    log = tmp_path / "publisher.log"
    process = start_process([sys.executable, "manage.py", "run_publisher"], log)
    try:
        time.sleep(0.5)
        if process.poll() is not None:
            raise RuntimeError(log.read_text())
        yield process
    finally:
        stop_process(process)
