"""Raw ASGI responses that watch for client disconnects while they wait.

Starlette's ``StreamingResponse`` only notices a disconnect on its next write;
a request still queued or in prefill would keep using the simulated GPU. These
responses race the work against ``http.disconnect`` and call ``on_disconnect``
(which aborts the engine request) the moment the client goes away.

Returning without finishing the body makes uvicorn close the connection: that
is how kill and drop-midstream faults cut a response.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from enginesim.server.faults import GARBAGE, FaultState
from enginesim.server.openai_api import dumps

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _race_disconnect(work: Awaitable[Any], receive: Receive) -> bool:
    """Run ``work``; True if the client disconnected first (work is then cancelled)."""
    main = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(receive))
    done, pending = await asyncio.wait({main, watcher}, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    if main in done:
        main.result()
        return False
    return True


class SSEResponse:
    """Streams SSE chunks as they are produced, one ``send`` per chunk (no buffering)."""

    def __init__(
        self,
        chunks: AsyncIterator[bytes],
        faults: FaultState,
        on_disconnect: Callable[[], None],
    ) -> None:
        self._chunks = chunks
        self._faults = faults
        self._on_disconnect = on_disconnect

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        if await _race_disconnect(self._pump(send), receive):
            self._on_disconnect()

    async def _pump(self, send: Send) -> None:
        sent = 0
        async for chunk in self._chunks:
            await self._faults.wait_not_hung()
            if self._faults.killed or (self._faults.dropping and sent >= self._faults.after_chunks):
                self._on_disconnect()
                return  # body left unfinished: uvicorn closes the connection
            if self._faults.garbling and sent == self._faults.after_chunks:
                chunk = GARBAGE
            if self._faults.dripping:
                await asyncio.sleep(self._faults.period)
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            sent += 1
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class PendingJSONResponse:
    """A JSON body that exists only once ``work`` completes (non-streamed completions)."""

    def __init__(
        self,
        work: Awaitable[None],
        render: Callable[[], dict[str, Any]],
        faults: FaultState,
        on_disconnect: Callable[[], None],
    ) -> None:
        self._work = work
        self._render = render
        self._faults = faults
        self._on_disconnect = on_disconnect

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if await _race_disconnect(self._work, receive):
            self._on_disconnect()
            return
        await self._faults.wait_not_hung()
        body = GARBAGE if self._faults.garbling else dumps(self._render()).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        if self._faults.killed or self._faults.dropping:
            self._on_disconnect()
            return  # headers promised a body that never comes: the client sees a cut
        if self._faults.dripping:
            await _drip(send, body, self._faults.period)
            return
        await send({"type": "http.response.body", "body": body, "more_body": False})


async def _drip(send: Send, body: bytes, period: float) -> None:
    """The body in 16-byte pieces, ``period`` seconds apart."""
    for start in range(0, len(body), 16):
        await asyncio.sleep(period)
        await send(
            {
                "type": "http.response.body",
                "body": body[start : start + 16],
                "more_body": start + 16 < len(body),
            }
        )
