"""The router's server protocol (``connections.guarded_protocol``) on an in-memory transport:
what it writes for an answer, and how a handler hears of its client going away."""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

import uvicorn
from uvicorn.server import ServerState

from router_worker.connections import DISCONNECT, ConnectionGuard, DisconnectWatch, guarded_protocol
from router_worker.metrics import RouterMetrics

REQUEST = (
    b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    b"content-length: 2\r\n\r\n{}"
)


class Recording(asyncio.Transport):
    """A transport that keeps what is written to it, write by write."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 40000), "sockname": ("127.0.0.1", 8000)}.get(
            name, default
        )

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def serve(app: Any) -> tuple[Any, Recording]:
    """A connection of the guarded protocol serving ``app``, made on a Recording."""
    config = uvicorn.Config(app, lifespan="off", access_log=False, proxy_headers=False)
    config.load()
    protocol_class = guarded_protocol(ConnectionGuard(RouterMetrics()))
    protocol = protocol_class(config=config, server_state=ServerState(), app_state={})
    transport = Recording()
    protocol.connection_made(transport)
    return protocol, transport


def test_an_answers_head_goes_out_with_its_first_body_bytes_in_one_write():
    """uvicorn writes a response head alone; the router's protocol holds it back so the
    client gets it in the same write (and segment) as the first event."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"data: one\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    async def main() -> list[bytes]:
        protocol, transport = serve(app)
        protocol.data_received(REQUEST)
        await asyncio.sleep(0.05)
        protocol.connection_lost(None)
        return transport.writes

    writes = asyncio.run(main())
    assert writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert writes[0].endswith(b"data: one\n\n\r\n"), writes
    assert b"data: [DONE]" in writes[1] and len(writes) == 2


def test_an_answered_requests_cycle_is_freed_without_the_cyclic_gc():
    """The head-holding transport lets go of its response cycle once it has the head: the
    two referring to each other would leave every request's objects to the cyclic GC,
    which frees hundreds of them at once, in a pause of the event loop."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"2")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"{}"})

    async def main() -> tuple[weakref.ref, Recording]:
        protocol, transport = serve(app)
        protocol.data_received(REQUEST)
        await asyncio.sleep(0.05)
        first = weakref.ref(protocol.cycle)
        protocol.data_received(REQUEST)  # keep-alive: the next request's cycle replaces it
        await asyncio.sleep(0.05)
        protocol.connection_lost(None)
        return first, transport

    gc.collect()
    gc.disable()
    try:
        first, transport = asyncio.run(main())
        assert first() is None
    finally:
        gc.enable()
    assert sum(w.startswith(b"HTTP/1.1 200 OK") for w in transport.writes) == 2


def test_an_answer_without_body_bytes_still_gets_its_head():
    """A HEAD request's answer has no body to carry its head: the head goes out alone."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"2")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b""})

    async def main() -> list[bytes]:
        protocol, transport = serve(app)
        protocol.data_received(b"HEAD /health HTTP/1.1\r\nhost: x\r\n\r\n")
        await asyncio.sleep(0.05)
        protocol.connection_lost(None)
        return transport.writes

    writes = asyncio.run(main())
    assert writes and writes[0].startswith(b"HTTP/1.1 200 OK\r\n"), writes


def test_a_handler_hears_of_its_client_going_away_without_a_watcher_task():
    """The watch registers with the connection: a client that goes away cancels the
    handler, also when it went away before the watch started; no task waits on receive()."""
    seen: dict[str, Any] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        task = asyncio.current_task()
        assert task is not None
        watch = DisconnectWatch(receive, task, scope["extensions"][DISCONNECT])
        seen["tasks"] = len(asyncio.all_tasks())
        watch.start()
        seen["tasks_watching"] = len(asyncio.all_tasks())
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen["gone"] = watch.gone
            late = DisconnectWatch(receive, task, scope["extensions"][DISCONNECT])
            task.uncancel()
            late.start()  # the client is already gone: cancelled at once
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                seen["late"] = late.gone
        finally:
            watch.stop()

    async def main() -> None:
        protocol, _ = serve(app)
        protocol.data_received(REQUEST)
        await asyncio.sleep(0.05)
        protocol.connection_lost(None)
        await asyncio.sleep(0.05)

    asyncio.run(asyncio.wait_for(main(), 10))
    assert seen["tasks_watching"] == seen["tasks"]
    assert seen["gone"] is True and seen["late"] is True
