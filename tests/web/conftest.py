"""Fixtures for the web UI and realtime tests: users of each role, a cluster built through
the services, Redis, and real server processes (uvicorn ASGI app, the publisher)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client

from controlplane.models import Cluster
from controlplane.services import clusters, policies
from controlplane.services.audit import Actor
from devharness import free_port, stop_process, wait_http
from devharness import start_process as harness_start
from router_worker.telemetry_contract import state_pattern

ROOT = Path(__file__).resolve().parents[2]
SYSTEM = Actor.system("web-tests")
PASSWORD = "web-tests-password-123"


def make_user(role: str | None, username: str | None = None):
    user = get_user_model().objects.create_user(username or f"web-{role}", password=PASSWORD)
    if role is not None:
        user.groups.add(Group.objects.get_or_create(name=role)[0])
    return user


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


def make_cluster(
    instance_urls: list[str] | None = None,
    name: str | None = None,
    model: str = "Qwen/Qwen2-7B-Instruct",
) -> Cluster:
    """A cluster with instances i0.. and policies lm (active) and rr, via the services."""
    name = name or f"web-{uuid.uuid4().hex[:8]}"
    cluster = clusters.create_cluster(SYSTEM, name=name, model=model, gpu_type="h20")
    urls = instance_urls or [f"http://127.0.0.1:{9300 + i}" for i in range(3)]
    for index, url in enumerate(urls):
        clusters.add_instance(SYSTEM, cluster.pk, name=f"i{index}", url=url, reason="setup")
    lm = policies.create_policy(SYSTEM, cluster.pk, name="lm", kind="lmetric")
    policies.create_policy(SYSTEM, cluster.pk, name="rr", kind="round_robin")
    policies.activate_policy(SYSTEM, cluster.pk, lm.pk, reason="setup")
    return Cluster.objects.get(pk=cluster.pk)


@pytest.fixture
def cluster(db) -> Cluster:
    return make_cluster()


@pytest.fixture
def redis_client() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.REDIS_URL)
    yield client
    client.close()


def clear_state(client: redis.Redis, cluster_name: str) -> None:
    for key in client.scan_iter(match=state_pattern(cluster_name)):
        client.delete(key)


def subprocess_env() -> dict[str, str]:
    """The environment of a server process that shares this test run's database and Redis."""
    db = settings.DATABASES["default"]
    url = f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "controlplane.settings_test",
        "SWITCHYARD_DATABASE_URL": url,
        "SWITCHYARD_REDIS_URL": settings.REDIS_URL,
        "SWITCHYARD_CHANNEL_PREFIX": settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"],
        "SWITCHYARD_SERVE_STATIC": "1",
        "PYTHONUNBUFFERED": "1",
    }


@dataclass
class Server:
    process: subprocess.Popen
    url: str
    log: Path


def start_process(
    args: list[str], log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen:
    """A server process on this test run's database and Redis (or ``env``), output in
    ``log``."""
    return harness_start(args, cwd=ROOT, env=env or subprocess_env(), log=log, stdin=None)


def start_asgi(port: int, log: Path, env: dict[str, str] | None = None) -> Server:
    """The full ASGI application (HTTP + websockets) under uvicorn, on the test database."""
    process = start_process(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "controlplane.asgi:application",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        log,
        env,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", 30, process=process, log=log)
    except BaseException:
        stop_process(process)
        raise
    return Server(process, f"http://127.0.0.1:{port}", log)


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
