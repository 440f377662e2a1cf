"""Fixtures for the web UI and realtime tests: users of each role, a cluster built through
the services, Redis, real server processes (uvicorn ASGI app, the publisher), an
in-process publisher feeding a collector, and a shared-traces folder with replay tasks
caught before dispatch. Their helpers: tests/web/helpers.py."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis
from django.conf import settings
from django.test import Client

from controlplane.models import Cluster
from controlplane.realtime.publisher import Publisher, PublisherSettings
from devharness import control_plane as cp
from devharness import free_port, stop_process
from tests.web.helpers import (
    TRACE,
    Collector,
    Server,
    make_cluster,
    make_user,
    start_asgi,
    start_process,
)


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
    process = start_process(cp.publisher_command(), log)
    try:
        time.sleep(0.5)
        if process.poll() is not None:
            raise RuntimeError(log.read_text())
        yield process
    finally:
        stop_process(process)


@pytest.fixture
async def setup(redis_client):
    name = f"pub-{uuid.uuid4().hex[:8]}"
    client = aioredis.from_url(settings.REDIS_URL)
    sent = Collector()
    publisher = Publisher(
        client,
        sent,
        PublisherSettings(interval_s=0.25, poll_s=0.01),
        load_clusters=lambda: {name: 42},
    )
    await publisher.refresh_clusters()
    yield name, publisher, sent, redis_client
    for key in redis_client.scan_iter(match=f"switchyard:state:{name}:*"):
        redis_client.delete(key)
    await client.aclose()


@pytest.fixture
def traces(tmp_path, monkeypatch, settings) -> Path:
    """A shared-traces folder with the head of a real Mooncake trace; uploads under tmp."""
    folder = tmp_path / "traces"
    folder.mkdir()
    source = Path(settings.BASE_DIR).parent / "shared" / "traces" / TRACE
    lines = source.read_text().splitlines()[:80]
    (folder / TRACE).write_text("\n".join(lines) + "\n")
    monkeypatch.setenv("SWITCHYARD_TRACES_DIR", str(folder))
    settings.SWITCHYARD_VAR_DIR = str(tmp_path / "var")
    return folder


@pytest.fixture
def dispatched(monkeypatch) -> list:
    from controlplane.celery import app

    sent: list = []
    monkeypatch.setattr(app, "send_task", lambda name, *args, **kw: sent.append((name, args)))
    return sent
