"""Websocket consumers. Every consumer requires a logged-in session (see asgi.py for Origin)."""

from __future__ import annotations

from channels.generic.websocket import AsyncJsonWebsocketConsumer

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
