"""The cluster live websocket over TCP to the real server (uvicorn on the test database):
who may connect, and the publisher → group → socket path."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack

import pytest
from asgiref.sync import async_to_sync
from django.test import Client
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection
from websockets.sync.client import connect as ws_connect
from websockets.typing import Origin

from controlplane.realtime.publisher import channel_layer_sender
from controlplane.realtime.state import group_name

from .helpers import PASSWORD, make_cluster, make_user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]
ALLOWED_ORIGIN = "http://127.0.0.1"


def _login(role: str | None) -> tuple[int, str]:
    cluster = make_cluster()
    user = make_user(role, f"ws-{role}")
    client = Client()
    assert client.login(username=user.username, password=PASSWORD)
    return cluster.pk, f"sessionid={client.cookies['sessionid'].value}"


@pytest.fixture
def sockets() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


def _connect(
    server, path: str, cookie: str | None, origin: str, stack: ExitStack
) -> ClientConnection | None:
    """The websocket, or None when the server refuses the handshake (403)."""
    url = server.url.replace("http://", "ws://") + path
    headers = [("Cookie", cookie)] if cookie else []
    try:
        connection = ws_connect(
            url, origin=Origin(origin), additional_headers=headers, open_timeout=10
        )
    except InvalidStatus as refused:
        assert refused.response.status_code == 403
        return None
    return stack.enter_context(connection)


def test_viewer_receives_what_the_publisher_sends(asgi_server, sockets) -> None:
    cluster_id, cookie = _login("viewer")
    socket = _connect(asgi_server, f"/ws/clusters/{cluster_id}/", cookie, ALLOWED_ORIGIN, sockets)
    assert socket is not None
    async_to_sync(channel_layer_sender())(group_name(cluster_id), {"type": "snapshot", "ts": 1.0})
    assert json.loads(socket.recv(timeout=10)) == {"type": "snapshot", "ts": 1.0}
    socket.send(json.dumps({"type": "ping", "id": 3}))
    assert json.loads(socket.recv(timeout=10)) == {"type": "pong", "id": 3}


def test_refused_without_a_session(asgi_server, sockets) -> None:
    cluster_id, _ = _login("viewer")
    path = f"/ws/clusters/{cluster_id}/"
    assert _connect(asgi_server, path, None, ALLOWED_ORIGIN, sockets) is None


def test_refused_from_a_foreign_origin(asgi_server, sockets) -> None:
    cluster_id, cookie = _login("viewer")
    path = f"/ws/clusters/{cluster_id}/"
    assert _connect(asgi_server, path, cookie, "http://evil.example", sockets) is None


def test_refused_for_a_user_without_a_role(asgi_server, sockets) -> None:
    cluster_id, cookie = _login(None)
    path = f"/ws/clusters/{cluster_id}/"
    assert _connect(asgi_server, path, cookie, ALLOWED_ORIGIN, sockets) is None


def test_refused_for_an_unknown_cluster(asgi_server, sockets) -> None:
    cluster_id, cookie = _login("viewer")
    path = f"/ws/clusters/{cluster_id + 1000}/"
    assert _connect(asgi_server, path, cookie, ALLOWED_ORIGIN, sockets) is None
