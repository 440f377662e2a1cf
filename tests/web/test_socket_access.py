"""Open websockets lose access when their session or role does: logout, deactivation and
a role taken away close them at once; a change no signal announces (a bulk update) closes
them at the next push once the periodic re-check is due. The ping socket needs a role too.
All over TCP to the real server (uvicorn on the test database); the re-check's own server is
started with a one-second interval (SWITCHYARD_WEBSOCKET_RECHECK)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import ExitStack

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection
from websockets.sync.client import connect as ws_connect
from websockets.typing import Origin

from controlplane.realtime.consumers import CLOSE_UNAUTHENTICATED
from controlplane.realtime.publisher import channel_layer_sender
from controlplane.realtime.state import group_name
from devharness import free_port

from .helpers import (
    PASSWORD,
    make_cluster,
    make_user,
    start_asgi,
    stop_process,
    subprocess_env,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]
ORIGIN = (b"origin", b"http://127.0.0.1")


def _login(role: str | None, name: str) -> tuple[int, Client, int]:
    cluster = make_cluster()
    user = make_user(role, name)
    client = Client()
    assert client.login(username=user.username, password=PASSWORD)
    return cluster.pk, client, user.pk


@pytest.fixture
def sockets() -> Iterator[ExitStack]:
    """Websockets opened by the test, closed after it."""
    with ExitStack() as stack:
        yield stack


def _connect(server, path: str, client: Client, stack: ExitStack) -> ClientConnection | None:
    """A websocket to the real server (uvicorn) over TCP with the client's session; None
    when the server refuses the handshake."""
    cookie = f"sessionid={client.cookies['sessionid'].value}"
    url = server.url.replace("http://", "ws://") + path
    try:
        connection = ws_connect(
            url,
            origin=Origin("http://127.0.0.1"),
            additional_headers=[("Cookie", cookie)],
            open_timeout=10,
        )
    except InvalidStatus as refused:
        assert refused.response.status_code == 403
        return None
    return stack.enter_context(connection)


def _push(cluster_id: int, message: dict) -> None:
    async_to_sync(channel_layer_sender())(group_name(cluster_id), message)


def _live(server, stack: ExitStack, role: str = "viewer", name: str = "ws-user"):
    cluster_id, client, user_pk = _login(role, name)
    socket = _connect(server, f"/ws/clusters/{cluster_id}/", client, stack)
    assert socket is not None
    _push(cluster_id, {"type": "snapshot", "n": 1})
    assert json.loads(socket.recv(timeout=10)) == {"type": "snapshot", "n": 1}
    return cluster_id, client, user_pk, socket


def _closed(socket: ClientConnection) -> None:
    with pytest.raises(ConnectionClosed) as closed:
        socket.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == CLOSE_UNAUTHENTICATED


def test_ping_needs_a_role(asgi_server, sockets) -> None:
    _, client, _ = _login(None, "ws-norole")
    assert _connect(asgi_server, "/ws/ping/", client, sockets) is None
    _, client, _ = _login("viewer", "ws-viewer")
    socket = _connect(asgi_server, "/ws/ping/", client, sockets)
    assert socket is not None
    socket.send(json.dumps({"n": 1}))
    assert json.loads(socket.recv(timeout=10)) == {"echo": {"n": 1}}


def test_logout_closes_the_open_socket(asgi_server, sockets) -> None:
    _, client, _, socket = _live(asgi_server, sockets)
    client.logout()
    _closed(socket)


def test_a_logout_is_announced_only_once_its_session_has_ended(transactional_db) -> None:
    """Django sends ``user_logged_out`` before it flushes the session. The announcement goes
    out from our receiver (at once, outside a transaction); a receiver connected after ours
    runs right after it and must already find the session ended, or a socket re-checking on
    the announcement would find it valid and stay open."""
    from django.contrib.auth.signals import user_logged_out

    from controlplane.realtime.access import session_allows

    _, client, user_pk = _login("viewer", "ws-order")
    session_key = client.session.session_key
    allowed_after_announcing: list[bool] = []

    def after_ours(sender, **kwargs) -> None:
        allowed = async_to_sync(session_allows)(session_key, user_pk, "viewer")
        allowed_after_announcing.append(allowed)

    user_logged_out.connect(after_ours, dispatch_uid="test-after-ours")
    try:
        client.logout()
    finally:
        user_logged_out.disconnect(dispatch_uid="test-after-ours")
    assert allowed_after_announcing == [False]


def test_deactivation_closes_the_open_socket(asgi_server, sockets) -> None:
    _, _, user_pk, socket = _live(asgi_server, sockets)
    user = get_user_model().objects.get(pk=user_pk)
    user.is_active = False
    user.save()
    _closed(socket)


def test_losing_the_role_closes_the_open_socket_and_a_grant_keeps_it(asgi_server, sockets) -> None:
    cluster_id, _, user_pk, socket = _live(asgi_server, sockets, "viewer")

    def regroup(add: str | None, remove: str | None) -> None:
        user = get_user_model().objects.get(pk=user_pk)
        if add:
            user.groups.add(Group.objects.get_or_create(name=add)[0])
        if remove:
            user.groups.remove(Group.objects.get(name=remove))

    regroup("operator", "viewer")  # still a role: stays open
    _push(cluster_id, {"type": "snapshot", "n": 2})
    assert json.loads(socket.recv(timeout=10)) == {"type": "snapshot", "n": 2}
    regroup(None, "operator")
    _closed(socket)


RECHECK_S = 1.0  # the re-check interval of the test's own server (production: 30 s)


def test_an_unannounced_change_closes_the_socket_at_the_next_due_push(
    transactional_db, tmp_path, sockets
) -> None:
    port = free_port()
    env = {**subprocess_env(), "SWITCHYARD_WEBSOCKET_RECHECK": str(RECHECK_S)}
    server = start_asgi(port, tmp_path / "uvicorn.log", env)
    sockets.callback(stop_process, server.process)
    cluster_id, _, user_pk, socket = _live(server, sockets)
    # a bulk update sends no signal: the socket learns of it only by re-checking
    get_user_model().objects.filter(pk=user_pk).update(is_active=False)
    _push(cluster_id, {"type": "snapshot", "n": 2})  # may arrive: the check may be fresh
    time.sleep(RECHECK_S)  # the last check ages past the interval
    _push(cluster_id, {"type": "snapshot", "n": 3})
    with pytest.raises(ConnectionClosed) as closed:
        while True:  # never the push after the check fell due
            assert json.loads(socket.recv(timeout=10)) == {"type": "snapshot", "n": 2}
    assert closed.value.rcvd is not None and closed.value.rcvd.code == CLOSE_UNAUTHENTICATED
