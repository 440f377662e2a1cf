"""Request bodies are limited before Django reads them (controlplane/body_limit.py): the real
ASGI application is driven in-process, and the test counts how much of a body it pulled."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.test import Client

from controlplane.asgi import application
from tests.controlplane.helpers import make_user
from tests.web.helpers import make_cluster

# Transactional: Django's request cycle closes the thread's database connection at its end.
pytestmark = pytest.mark.django_db(transaction=True)
MIB = 1024 * 1024
CHUNK = 64 * 1024


@dataclass
class Exchange:
    """One request through the ASGI app: the body is offered in chunks, pulled on demand."""

    size: int
    pulled: int = 0
    messages: list[dict[str, Any]] = field(default_factory=list)

    async def receive(self) -> dict[str, Any]:
        if self.pulled >= self.size:  # the client waits for its answer
            await asyncio.sleep(3600)
        chunk = min(CHUNK, self.size - self.pulled)
        self.pulled += chunk
        return {"type": "http.request", "body": b"x" * chunk, "more_body": self.pulled < self.size}

    async def send(self, message: dict[str, Any]) -> None:
        self.messages.append(message)

    @property
    def status(self) -> int | None:
        starts = [m for m in self.messages if m["type"] == "http.response.start"]
        return starts[0]["status"] if starts else None

    @property
    def text(self) -> str:
        return b"".join(
            m.get("body", b"") for m in self.messages if m["type"] == "http.response.body"
        ).decode()


def post(path: str, size: int, *, declare: bool = True, cookie: str = "") -> Exchange:
    headers = [(b"host", b"127.0.0.1"), (b"content-type", b"multipart/form-data; boundary=b")]
    if declare:
        headers.append((b"content-length", str(size).encode()))
    if cookie:
        headers.append((b"cookie", cookie.encode()))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8080),
    }
    exchange = Exchange(size)
    async_to_sync(application)(scope, exchange.receive, exchange.send)
    return exchange


def session_of(user) -> str:
    client = Client()
    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


@pytest.fixture
def world() -> dict[str, int]:
    return {"alpha": make_cluster().pk}


@pytest.fixture
def users() -> dict:
    return {role: make_user(role) for role in ("viewer", "operator")}


def upload_path(world) -> str:
    return f"/clusters/{world['alpha']}/replays/create/"


def test_an_anonymous_oversized_body_is_refused_unread(world) -> None:
    exchange = post(upload_path(world), 70 * MIB)
    assert exchange.status == 413
    assert exchange.pulled == 0
    assert "request body too large" in exchange.text and "signed-in operator" in exchange.text


def test_an_oversized_api_body_gets_a_json_error(world) -> None:
    exchange = post("/api/v1/clusters", 5 * MIB)
    assert exchange.status == 413 and exchange.pulled == 0
    assert exchange.text.startswith('{"detail": "request body too large')


def test_a_chunked_body_is_cut_off_at_the_small_limit(world, users) -> None:
    cookie = session_of(users["operator"])
    exchange = post(upload_path(world), 70 * MIB, declare=False, cookie=cookie)
    assert exchange.status == 413
    assert exchange.pulled <= settings.SWITCHYARD_MAX_BODY_BYTES + CHUNK
    assert "without Content-Length" in exchange.text


@pytest.mark.parametrize("role", ["viewer", None])
def test_a_session_without_the_upload_role_keeps_the_small_limit(world, users, role) -> None:
    cookie = session_of(users[role]) if role else "sessionid=made-up-by-the-client"
    exchange = post(upload_path(world), 10 * MIB, cookie=cookie)
    assert (exchange.status, exchange.pulled) == (413, 0)


def test_an_operator_may_upload_up_to_the_upload_limit(world, users) -> None:
    cookie = session_of(users["operator"])
    within = post(upload_path(world), 10 * MIB, cookie=cookie)
    assert within.status != 413 and within.pulled == 10 * MIB  # Django read it (then 403: CSRF)
    over = post(
        upload_path(world), settings.SWITCHYARD_MAX_TRACE_UPLOAD_BYTES + 2 * MIB, cookie=cookie
    )
    assert (over.status, over.pulled) == (413, 0)
    assert "65.0 MiB" in over.text  # 64 MiB of trace plus the form's other fields


def test_the_upload_limit_is_only_for_upload_views(world, users) -> None:
    cookie = session_of(users["operator"])
    exchange = post(f"/clusters/{world['alpha']}/policy/apply/", 10 * MIB, cookie=cookie)
    assert (exchange.status, exchange.pulled) == (413, 0)


def test_small_bodies_pass_untouched(world) -> None:
    exchange = post("/login/", 1000)
    assert exchange.status == 403 and exchange.pulled == 1000  # CSRF: Django saw the request
