"""Websocket consumers. Every consumer requires a logged-in session (see asgi.py for Origin)."""

from __future__ import annotations

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from controlplane.services.roles import role_of

from .state import group_name

# WebSocket close code for "policy violation" (RFC 6455 §7.4.1): used for missing login.
CLOSE_UNAUTHENTICATED = 4401


class AuthenticatedJsonConsumer(AsyncJsonWebsocketConsumer):
    """Refuses the handshake unless the session belongs to an active user."""

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not user.is_active:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        await self.accept()
        await self.on_authenticated_connect()

    async def on_authenticated_connect(self) -> None:
        """Hook for subclasses: join groups, send the first message."""


class PingConsumer(AuthenticatedJsonConsumer):
    """Diagnostic round trip through the channel layer: what the client sends comes back
    through the Redis group `ping.<user id>`, proving the layer works end to end."""

    @property
    def group(self) -> str:
        return f"ping.{self.scope['user'].pk}"

    async def on_authenticated_connect(self) -> None:
        await self.channel_layer.group_add(self.group, self.channel_name)

    async def disconnect(self, code: int) -> None:
        if self.scope.get("user") is not None and self.scope["user"].is_authenticated:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content: dict, **kwargs) -> None:
        await self.channel_layer.group_send(self.group, {"type": "ping.echo", "payload": content})

    async def ping_echo(self, event: dict) -> None:
        await self.send_json({"echo": event["payload"]})


class ClusterLiveConsumer(AuthenticatedJsonConsumer):
    """A cluster's live dashboard: joins the cluster's group and relays what the publisher
    sends (snapshots, events, config notifications). Users without a role are refused."""

    async def connect(self) -> None:
        self.group: str | None = None
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not await _may_view(user, self.cluster_id):
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        await super().connect()

    @property
    def cluster_id(self) -> int:
        return int(self.scope["url_route"]["kwargs"]["cluster_id"])

    async def on_authenticated_connect(self) -> None:
        self.group = group_name(self.cluster_id)
        await self.channel_layer.group_add(self.group, self.channel_name)

    async def disconnect(self, code: int) -> None:
        if self.group is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content: dict, **kwargs) -> None:
        """Dashboards only listen; a ping gets a pong so clients can measure the link."""
        if content.get("type") == "ping":
            await self.send_json({"type": "pong", "id": content.get("id")})

    async def cluster_message(self, event: dict) -> None:
        await self.send_json(event["message"])


@database_sync_to_async
def _may_view(user, cluster_id: int) -> bool:
    from controlplane.models import Cluster

    return role_of(user) is not None and Cluster.objects.filter(pk=cluster_id).exists()
