"""The Python floor of the router overhead study: the router's HTTP stack with nothing else.

The same server (uvicorn with uvloop and httptools, access log and proxy headers off) and
the same upstream transport (``router_worker.upstream.FastTransport``) as the router, in
front of the same engines, round robin, and nothing of what the router does per request:
no body parsing, tokenizing, hashing, policy, lifecycle, metrics or limits. What Switchyard
adds beyond this row is the cost of its own per-request work; what this row adds beyond the
direct path is the cost of a Python proxy hop on this machine.

    python -m bench.lib.python_floor PORT ENGINE_PORT [ENGINE_PORT ...]

``GET /health`` answers 200; any POST is forwarded byte for byte (``X-Request-Id`` passed
on) and its answer relayed, a stream chunk by chunk.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import uvicorn

from router_worker.upstream import FastTransport, Target, make_target

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

FIXED_HEADERS = ((b"content-type", b"application/json"), (b"accept-encoding", b"identity"))


class Forwarder:
    """A raw ASGI app: round robin over ``engines`` (ports on 127.0.0.1)."""

    def __init__(self, engines: list[int]) -> None:
        self.engines = engines
        self.turn = itertools.count()
        self.transport = FastTransport()
        self.targets: dict[tuple[int, str], Target] = {}

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
        elif scope["type"] == "http" and scope["method"] == "POST":
            await self.forward(scope, receive, send)
        elif scope["type"] == "http":
            await _answer(send, 200 if scope["path"] == "/health" else 404, b"")

    async def forward(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        body = await _read_body(receive)
        port = self.engines[next(self.turn) % len(self.engines)]
        target = self._target(port, scope["path"])
        headers = [(k, v) for k, v in scope["headers"] if k == b"x-request-id"]
        response = await self.transport.post(target, headers, body)
        try:
            content_type = response.header(b"content-type", b"application/json")
            if content_type.startswith(b"text/event-stream"):
                await send(_start(response.status_code, content_type))
                while (chunk := await response.next_chunk()) is not None:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b""})
            else:
                data = await response.read()
                await _answer(send, response.status_code, data, content_type)
        finally:
            await response.aclose()

    def _target(self, port: int, path: str) -> Target:
        key = (port, path)
        target = self.targets.get(key)
        if target is None:
            url = f"http://127.0.0.1:{port}{path}"
            target = self.targets[key] = make_target(url, FIXED_HEADERS, 10.0, 600.0)
        return target


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _start(status: int, content_type: bytes, length: int | None = None) -> Message:
    headers = [(b"content-type", content_type)]
    if length is not None:
        headers.append((b"content-length", b"%d" % length))
    return {"type": "http.response.start", "status": status, "headers": headers}


async def _answer(
    send: Send, status: int, data: bytes, content_type: bytes = b"text/plain"
) -> None:
    await send(_start(status, content_type, len(data)))
    await send({"type": "http.response.body", "body": data})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        else:
            await send({"type": "lifespan.shutdown.complete"})
            return


def main(argv: list[str]) -> None:
    port, *engines = (int(arg) for arg in argv)
    uvicorn.run(
        Forwarder(engines),
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
        proxy_headers=False,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
