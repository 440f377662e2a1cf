"""The cluster live websocket: who may connect, and the publisher → group → socket path."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from controlplane.asgi import application
from controlplane.realtime.publisher import channel_layer_sender
from controlplane.realtime.state import group_name

from .helpers import PASSWORD, make_cluster, make_user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]
ALLOWED_ORIGIN = (b"origin", b"http://127.0.0.1")


def _login(role: str | None) -> tuple[int, bytes]:
    cluster = make_cluster()
    user = make_user(role, f"ws-{role}")
    client = Client()
    assert client.login(username=user.username, password=PASSWORD)
    return cluster.pk, f"sessionid={client.cookies['sessionid'].value}".encode()


async def _connect(path: str, headers: list) -> tuple[WebsocketCommunicator, bool]:
    communicator = WebsocketCommunicator(application, path, headers=headers)
    connected, _ = await communicator.connect(timeout=5)
    return communicator, connected


async def test_viewer_receives_what_the_publisher_sends() -> None:
    cluster_id, cookie = await sync_to_async(_login)("viewer")
    socket, connected = await _connect(
        f"/ws/clusters/{cluster_id}/", [(b"cookie", cookie), ALLOWED_ORIGIN]
    )
    assert connected
    await channel_layer_sender()(group_name(cluster_id), {"type": "snapshot", "ts": 1.0})
    assert await socket.receive_json_from(timeout=5) == {"type": "snapshot", "ts": 1.0}
    await socket.send_json_to({"type": "ping", "id": 3})
    assert await socket.receive_json_from(timeout=5) == {"type": "pong", "id": 3}
    await socket.disconnect()


async def test_refused_without_a_session() -> None:
    cluster_id, _ = await sync_to_async(_login)("viewer")
    socket, connected = await _connect(f"/ws/clusters/{cluster_id}/", [ALLOWED_ORIGIN])
    assert not connected
    await socket.disconnect()


async def test_refused_from_a_foreign_origin() -> None:
    cluster_id, cookie = await sync_to_async(_login)("viewer")
    socket, connected = await _connect(
        f"/ws/clusters/{cluster_id}/", [(b"cookie", cookie), (b"origin", b"http://evil.example")]
    )
    assert not connected
    await socket.disconnect()


async def test_refused_for_a_user_without_a_role() -> None:
    cluster_id, cookie = await sync_to_async(_login)(None)
    socket, connected = await _connect(
        f"/ws/clusters/{cluster_id}/", [(b"cookie", cookie), ALLOWED_ORIGIN]
    )
    assert not connected
    await socket.disconnect()


async def test_refused_for_an_unknown_cluster() -> None:
    cluster_id, cookie = await sync_to_async(_login)("viewer")
    socket, connected = await _connect(
        f"/ws/clusters/{cluster_id + 1000}/", [(b"cookie", cookie), ALLOWED_ORIGIN]
    )
    assert not connected
    await socket.disconnect()
