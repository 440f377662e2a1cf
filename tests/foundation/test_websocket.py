"""Websocket round trip through the full ASGI application and the Redis channel layer."""

from __future__ import annotations

import pytest
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client

from controlplane.asgi import application

pytestmark = pytest.mark.django_db(transaction=True)


def session_cookie() -> bytes:
    """A logged-in viewer's session (a socket needs a role, as every page does)."""
    user = get_user_model().objects.create_user("ws-user", password="ws-password-123")
    user.groups.add(Group.objects.get_or_create(name="viewer")[0])
    client = Client()
    assert client.login(username="ws-user", password="ws-password-123")
    return f"sessionid={client.cookies['sessionid'].value}".encode()


async def connect(headers: list[tuple[bytes, bytes]]) -> tuple[WebsocketCommunicator, bool]:
    communicator = WebsocketCommunicator(application, "/ws/ping/", headers=headers)
    connected, _ = await communicator.connect()
    return communicator, connected


async def test_logged_in_round_trip() -> None:
    from asgiref.sync import sync_to_async

    cookie = await sync_to_async(session_cookie)()
    communicator, connected = await connect([(b"cookie", cookie), (b"origin", b"http://127.0.0.1")])
    assert connected
    await communicator.send_json_to({"hello": "switchyard"})
    assert await communicator.receive_json_from(timeout=5) == {"echo": {"hello": "switchyard"}}
    await communicator.disconnect()


async def test_refused_without_session() -> None:
    communicator, connected = await connect([(b"origin", b"http://127.0.0.1")])
    assert not connected
    await communicator.disconnect()


async def test_refused_from_foreign_origin() -> None:
    from asgiref.sync import sync_to_async

    cookie = await sync_to_async(session_cookie)()
    communicator, connected = await connect(
        [(b"cookie", cookie), (b"origin", b"http://evil.example")]
    )
    assert not connected
    await communicator.disconnect()
