"""Open websockets lose access when their session or role does: logout, deactivation and
a role taken away close them at once; a change no signal announces (a bulk update) closes
them at the next push once the periodic re-check is due. The ping socket needs a role too."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client

from controlplane.asgi import application
from controlplane.realtime import access
from controlplane.realtime.consumers import CLOSE_UNAUTHENTICATED
from controlplane.realtime.publisher import channel_layer_sender
from controlplane.realtime.state import group_name

from .helpers import PASSWORD, make_cluster, make_user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]
ORIGIN = (b"origin", b"http://127.0.0.1")


def _login(role: str | None, name: str) -> tuple[int, Client, int]:
    cluster = make_cluster()
    user = make_user(role, name)
    client = Client()
    assert client.login(username=user.username, password=PASSWORD)
    return cluster.pk, client, user.pk


async def _open(path: str, client: Client) -> tuple[WebsocketCommunicator, bool]:
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    socket = WebsocketCommunicator(application, path, headers=[(b"cookie", cookie), ORIGIN])
    connected, _ = await socket.connect(timeout=5)
    return socket, connected


async def _live(role: str = "viewer", name: str = "ws-user"):
    cluster_id, client, user_pk = await sync_to_async(_login)(role, name)
    socket, connected = await _open(f"/ws/clusters/{cluster_id}/", client)
    assert connected
    await channel_layer_sender()(group_name(cluster_id), {"type": "snapshot", "n": 1})
    assert await socket.receive_json_from(timeout=5) == {"type": "snapshot", "n": 1}
    return cluster_id, client, user_pk, socket


async def _closed(socket: WebsocketCommunicator) -> None:
    output = await socket.receive_output(timeout=5)
    assert output == {"type": "websocket.close", "code": CLOSE_UNAUTHENTICATED}


async def test_ping_needs_a_role() -> None:
    _, client, _ = await sync_to_async(_login)(None, "ws-norole")
    socket, connected = await _open("/ws/ping/", client)
    assert not connected
    _, client, _ = await sync_to_async(_login)("viewer", "ws-viewer")
    socket, connected = await _open("/ws/ping/", client)
    assert connected
    await socket.send_json_to({"n": 1})
    assert await socket.receive_json_from(timeout=5) == {"echo": {"n": 1}}
    await socket.disconnect()


async def test_logout_closes_the_open_socket() -> None:
    _, client, _, socket = await _live()
    await sync_to_async(client.logout)()
    await _closed(socket)


async def test_deactivation_closes_the_open_socket() -> None:
    _, _, user_pk, socket = await _live()

    def deactivate() -> None:
        user = get_user_model().objects.get(pk=user_pk)
        user.is_active = False
        user.save()

    await sync_to_async(deactivate)()
    await _closed(socket)


async def test_losing_the_role_closes_the_open_socket_and_a_grant_keeps_it() -> None:
    cluster_id, _, user_pk, socket = await _live("viewer")

    def regroup(add: str | None, remove: str | None) -> None:
        user = get_user_model().objects.get(pk=user_pk)
        if add:
            user.groups.add(Group.objects.get_or_create(name=add)[0])
        if remove:
            user.groups.remove(Group.objects.get(name=remove))

    await sync_to_async(regroup)("operator", "viewer")  # still a role: stays open
    await channel_layer_sender()(group_name(cluster_id), {"type": "snapshot", "n": 2})
    assert await socket.receive_json_from(timeout=5) == {"type": "snapshot", "n": 2}
    await sync_to_async(regroup)(None, "operator")
    await _closed(socket)


async def test_an_unannounced_change_closes_the_socket_at_the_next_due_push(monkeypatch) -> None:
    cluster_id, _, user_pk, socket = await _live()
    await sync_to_async(get_user_model().objects.filter(pk=user_pk).update)(is_active=False)
    monkeypatch.setattr(access, "RECHECK_S", 0.0)
    await channel_layer_sender()(group_name(cluster_id), {"type": "snapshot", "n": 3})
    await _closed(socket)
