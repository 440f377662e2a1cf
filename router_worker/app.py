"""The router's ASGI application: the raw data path for /v1, Starlette for the rest."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from router_worker.admin import build_admin_app
from router_worker.ingress import ENDPOINTS, Receive, Scope, Send
from router_worker.service import Service


class RouterApp:
    """``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models`` skip the framework."""

    def __init__(
        self, service: Service, on_start: Callable[[Service], Awaitable[None]] | None = None
    ) -> None:
        self.service = service
        self.on_start = on_start

        @contextlib.asynccontextmanager
        async def lifespan(_app: Any) -> AsyncIterator[None]:
            if self.on_start is not None:
                await self.on_start(service)
            await service.start()
            try:
                yield
            finally:
                await service.stop()

        self.rest = build_admin_app(service, lifespan)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            endpoint = ENDPOINTS.get(path)
            if endpoint is not None and scope["method"] == "POST":
                await self.service.ingress.generate(scope, receive, send, endpoint)
                return
            if path == "/v1/models" and scope["method"] == "GET":
                await self.service.ingress.models(scope, send)
                return
        await self.rest(scope, receive, send)
