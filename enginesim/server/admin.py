"""Process-wide admin API (``--admin-port``): faults for any instance, even a killed one."""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from enginesim.server.faults import FaultError, FaultRequest
from enginesim.server.instance import Instance, QuietServer


def build_admin_app(instances: list[Instance]) -> Starlette:
    async def list_instances(request: Request) -> Response:
        return JSONResponse(
            [
                {
                    "instance": inst.settings.index,
                    "port": inst.settings.port,
                    "model": inst.served_name,
                    "fault": inst.faults.as_json(),
                }
                for inst in instances
            ]
        )

    async def post_fault(request: Request) -> Response:
        body = await request.json()
        index = body.get("instance") if isinstance(body, dict) else None
        if not isinstance(index, int) or not 0 <= index < len(instances):
            return JSONResponse({"error": {"message": "instance must be a valid index"}}, 400)
        try:
            fault = FaultRequest.from_json(body)
            await instances[index].apply_fault(fault)
        except (FaultError, ValueError) as exc:
            return JSONResponse({"error": {"message": str(exc)}}, 400)
        return JSONResponse({"instance": index, **instances[index].faults.as_json()})

    return Starlette(
        routes=[
            Route("/admin/instances", list_instances, methods=["GET"]),
            Route("/admin/fault", post_fault, methods=["POST"]),
        ]
    )


class AdminServer:
    def __init__(self, server: uvicorn.Server, task: asyncio.Task[None]) -> None:
        self._server = server
        self._task = task

    async def stop(self) -> None:
        self._server.should_exit = True
        await asyncio.gather(self._task, return_exceptions=True)


async def start_admin_server(app: Any, host: str, port: int) -> AdminServer:
    config = uvicorn.Config(app, host=host, port=port, lifespan="off", ws="none",
                            log_level="warning", access_log=False)  # fmt: skip
    server = QuietServer(config)
    sock = config.bind_socket()
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started and not task.done():
        await asyncio.sleep(0.01)
    return AdminServer(server, task)
