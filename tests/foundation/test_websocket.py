"""Websocket round trip through the full ASGI application, served by uvicorn over TCP, and
the Redis channel layer."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
from channels_redis.core import RedisChannelLayer
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect
from websockets.typing import Origin

from devharness import free_port, stop_process
from tests.web.helpers import Server, start_asgi

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def server(django_db_setup, tmp_path_factory) -> Iterator[Server]:
    """uvicorn on the test database (it reads sessions per connection)."""
    running = start_asgi(free_port(), tmp_path_factory.mktemp("asgi") / "uvicorn.log")
    yield running
    stop_process(running.process)


def session_cookie() -> str:
    """A logged-in viewer's session (a socket needs a role, as every page does)."""
    user = get_user_model().objects.create_user("ws-user", password="ws-password-123")
    user.groups.add(Group.objects.get_or_create(name="viewer")[0])
    client = Client()
    assert client.login(username="ws-user", password="ws-password-123")
    return f"sessionid={client.cookies['sessionid'].value}"


def ping_url(server: Server) -> str:
    return server.url.replace("http://", "ws://") + "/ws/ping/"


def refused(server: Server, cookie: str | None, origin: str) -> bool:
    headers = [("Cookie", cookie)] if cookie else []
    try:
        with ws_connect(ping_url(server), origin=Origin(origin), additional_headers=headers):
            return False
    except InvalidStatus as error:
        return error.response.status_code == 403


def test_logged_in_round_trip(server) -> None:
    headers = [("Cookie", session_cookie())]
    with ws_connect(
        ping_url(server), origin=Origin("http://127.0.0.1"), additional_headers=headers
    ) as socket:
        socket.send(json.dumps({"hello": "switchyard"}))
        assert json.loads(socket.recv(timeout=10)) == {"echo": {"hello": "switchyard"}}


def test_refused_without_session(server) -> None:
    assert refused(server, None, "http://127.0.0.1")


def test_refused_from_foreign_origin(server) -> None:
    assert refused(server, session_cookie(), "http://evil.example")


async def test_an_idle_consumer_outlives_a_blocking_pop_answered_late() -> None:
    """A websocket's consumer waits on the layer with blocking pops; on a loaded host Redis
    answers one a little late. Here the pop blocks 6 s, past redis-py's default 5 s read
    timeout, which killed the consumer (its socket closed without a close frame); the
    layer's own socket timeout must outlast it, so only this test's wait ends the receive."""
    layer = RedisChannelLayer(**settings.CHANNEL_LAYERS["default"]["CONFIG"])
    layer.brpop_timeout = 6
    try:
        channel = await layer.new_channel()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(layer.receive(channel), 7.5)
    finally:
        await layer.close_pools()
