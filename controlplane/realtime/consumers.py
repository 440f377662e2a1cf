"""Websocket consumers. Every consumer requires a logged-in session of an active user with a
role (see asgi.py for Origin), checked at the handshake and again while the socket is open
(see `access`): a socket whose session ended or whose user lost the role is closed."""

from __future__ import annotations

import time

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from . import access
from .state import group_name

# WebSocket close code for "policy violation" (RFC 6455 §7.4.1): used for missing login.
CLOSE_UNAUTHENTICATED = 4401


class AuthenticatedJsonConsumer(AsyncJsonWebsocketConsumer):
    """Refuses the handshake unless the session belongs to an active user holding
    ``minimum_role``; closes the socket when that stops being true."""

    minimum_role = "viewer"

    async def connect(self) -> None:
        self.access_group: str | None = None
        self.revoked = False
        if not await self.allowed():
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.access_group = access.access_group(self.scope["user"].pk)
        await self.channel_layer.group_add(self.access_group, self.channel_name)
        self.checked_at = time.monotonic()
        await self.accept()
        await self.on_authenticated_connect()

    async def allowed(self) -> bool:
        user, session = self.scope.get("user"), self.scope.get("session")
        if user is None or not user.is_authenticated or session is None:
            return False
        return await access.session_allows(session.session_key, user.pk, self.minimum_role)

    async def on_authenticated_connect(self) -> None:
        """Hook for subclasses: join groups, send the first message."""

    async def disconnect(self, code: int) -> None:
        if self.access_group is not None:
            await self.channel_layer.group_discard(self.access_group, self.channel_name)

    async def access_check(self, event: dict) -> None:
        """The user logged out, or their account or roles changed: re-check now."""
        await self.recheck()

    async def recheck(self) -> bool:
        self.checked_at = time.monotonic()
        if not self.revoked and not await self.allowed():
            self.revoked = True
            await self.close(code=CLOSE_UNAUTHENTICATED)
        return not self.revoked

    async def push(self, message: dict) -> None:
        """Send, re-checking access first when the last check is as old as the re-check
        interval (``settings.WEBSOCKET_RECHECK_S``)."""
        if self.revoked:
            return
        due = time.monotonic() - self.checked_at >= settings.WEBSOCKET_RECHECK_S
        if due and not await self.recheck():
            return
        await self.send_json(message)


class PingConsumer(AuthenticatedJsonConsumer):
    """Diagnostic round trip through the channel layer: what the client sends comes back
    through the Redis group `ping.<user id>`, proving the layer works end to end."""

    @property
    def group(self) -> str:
        return f"ping.{self.scope['user'].pk}"

    async def on_authenticated_connect(self) -> None:
        await self.channel_layer.group_add(self.group, self.channel_name)

    async def disconnect(self, code: int) -> None:
        if self.access_group is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)
        await super().disconnect(code)

    async def receive_json(self, content: dict, **kwargs) -> None:
        if not self.revoked:
            await self.channel_layer.group_send(
                self.group, {"type": "ping.echo", "payload": content}
            )

    async def ping_echo(self, event: dict) -> None:
        await self.push({"echo": event["payload"]})


class ClusterLiveConsumer(AuthenticatedJsonConsumer):
    """A cluster's live dashboard: joins the cluster's group and relays what the publisher
    sends (snapshots, events, config notifications). Users without a role are refused."""

    async def connect(self) -> None:
        self.group: str | None = None
        await super().connect()

    async def allowed(self) -> bool:
        return await super().allowed() and await _cluster_exists(self.cluster_id)

    @property
    def cluster_id(self) -> int:
        return int(self.scope["url_route"]["kwargs"]["cluster_id"])

    async def on_authenticated_connect(self) -> None:
        self.group = group_name(self.cluster_id)
        await self.channel_layer.group_add(self.group, self.channel_name)

    async def disconnect(self, code: int) -> None:
        if self.group is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)
        await super().disconnect(code)

    async def receive_json(self, content: dict, **kwargs) -> None:
        """Dashboards only listen; a ping gets a pong so clients can measure the link."""
        if isinstance(content, dict) and content.get("type") == "ping":
            await self.push({"type": "pong", "id": content.get("id")})

    async def cluster_message(self, event: dict) -> None:
        await self.push(event["message"])


@database_sync_to_async
def _cluster_exists(cluster_id: int) -> bool:
    from controlplane.models import Cluster

    return Cluster.objects.filter(pk=cluster_id).exists()
