"""The router's upstream transport: keep-alive reuse, chunked streaming, stale connections."""

from __future__ import annotations

import asyncio
import gc
import weakref

import httpx
import pytest

from router_worker.upstream import AcyclicClient, FastTransport, make_target


class TinyServer:
    """HTTP/1.1 on loopback: a chunked body of three pieces; optionally closes when idle."""

    def __init__(self, close_after_response: bool = False) -> None:
        self.connections = 0
        self.close_after_response = close_after_response
        self.server: asyncio.base_events.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(
                    next(
                        line.split(b":")[1]
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    )
                )
                await reader.readexactly(length)
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"transfer-encoding: chunked\r\n\r\n"
                )
                for piece in (b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"):
                    writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    await writer.drain()
                    await asyncio.sleep(0.01)
                writer.write(b"0\r\n\r\n")
                await writer.drain()
                if self.close_after_response:
                    await asyncio.sleep(0.05)
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1/completions"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()


def test_keep_alive_reuse_and_chunk_by_chunk_streaming():
    async def scenario() -> None:
        server = TinyServer()
        async with server as url, httpx.AsyncClient(transport=FastTransport()) as client:
            for _ in range(3):
                request = client.build_request("POST", url, content=b"{}")
                response = await client.send(request, stream=True)
                chunks = [chunk async for chunk in response.aiter_raw()]
                await response.aclose()
                assert chunks == [b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"]
        assert server.connections == 1

    asyncio.run(scenario())


def test_the_routers_client_leaves_no_reference_cycle_per_response():
    """httpx binds a response's stream to the response; the router's client unbinds a
    read response, so its scrapes and probes do not pile up for the cyclic GC to free in
    one long pause of the event loop."""

    async def scenario() -> weakref.ref[httpx.Response]:
        async with TinyServer() as url, AcyclicClient(transport=FastTransport()) as client:
            response = await client.post(url, content=b"{}")
            assert response.status_code == 200 and response.text.endswith("[DONE]\n\n")
            return weakref.ref(response)

    gc.collect()
    gc.disable()
    try:
        assert asyncio.run(scenario())() is None
    finally:
        gc.enable()


def test_stale_keep_alive_connection_is_replaced_transparently():
    async def scenario() -> None:
        server = TinyServer(close_after_response=True)
        async with server as url, httpx.AsyncClient(transport=FastTransport()) as client:
            for _ in range(3):
                response = await client.post(url, content=b"{}")
                assert response.status_code == 200
                await asyncio.sleep(0.1)  # the server hangs up the idle connection
        assert server.connections == 3

    asyncio.run(scenario())


def test_connect_refused_and_read_timeout_are_httpx_errors():
    async def scenario() -> None:
        async with httpx.AsyncClient(transport=FastTransport()) as client:
            with pytest.raises(httpx.ConnectError):
                await client.post("http://127.0.0.1:9/", content=b"{}")

            async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                await asyncio.sleep(5)

            server = await asyncio.start_server(silent, "127.0.0.1", 0)
            port = server.sockets[0].getsockname()[1]
            with pytest.raises(httpx.ReadTimeout):
                await client.post(
                    f"http://127.0.0.1:{port}/", content=b"{}", timeout=httpx.Timeout(1.0, read=0.2)
                )
            server.close()

    asyncio.run(scenario())


class DripServer:
    """Chunked SSE pieces ``gap`` s apart; ``stall_after`` pieces, then silence."""

    def __init__(self, pieces: int, gap: float, stall_after: int | None = None) -> None:
        self.pieces, self.gap, self.stall_after = pieces, gap, stall_after
        self.server: asyncio.base_events.Server | None = None
        self.connections = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(
                    next(
                        line.split(b":")[1]
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    )
                )
                await reader.readexactly(length)
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"transfer-encoding: chunked\r\n\r\n"
                )
                for k in range(self.pieces):
                    if self.stall_after is not None and k == self.stall_after:
                        await asyncio.sleep(5)
                    piece = b"data: %d\n\n" % k
                    writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    await writer.drain()
                    await asyncio.sleep(self.gap)
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1/completions"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()


async def _drain(response: object) -> list[bytes]:
    chunks = []
    while (chunk := await response.next_chunk()) is not None:  # type: ignore[attr-defined]
        chunks.append(chunk)
    return chunks


def test_post_api_streams_reuses_and_reports_the_end():
    async def scenario() -> None:
        server = DripServer(pieces=3, gap=0.01)
        transport = FastTransport()
        async with server as url:
            target = make_target(url, [(b"content-type", b"application/json")], 1.0, 1.0)
            for _ in range(3):
                response = await transport.post(target, [(b"x-request-id", b"r1")], b"{}")
                assert response.status_code == 200
                assert response.header(b"content-type", b"") == b"text/event-stream"
                assert not response.finished
                assert b"".join(await _drain(response)) == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
                assert response.finished
                await response.aclose()
        assert server.connections == 1
        await transport.aclose()

    asyncio.run(scenario())


def test_read_timeout_is_per_gap_between_chunks_not_per_stream():
    async def scenario() -> None:
        transport = FastTransport()
        # 8 pieces 0.1 s apart: 0.8 s in all, more than the 0.3 s read timeout, never a gap
        # as long as it: no timeout.
        async with DripServer(pieces=8, gap=0.1) as url:
            target = make_target(url, [], 1.0, 0.3)
            response = await transport.post(target, [], b"{}")
            assert len(b"".join(await _drain(response)).split(b"\n\n")) == 9
            await response.aclose()
        # Silence after two pieces: ReadTimeout once the gap reaches the read timeout.
        async with DripServer(pieces=4, gap=0.01, stall_after=2) as url:
            target = make_target(url, [], 1.0, 0.3)
            response = await transport.post(target, [], b"{}")
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(httpx.ReadTimeout):
                await _drain(response)
            assert 0.25 < loop.time() - started < 2.0
            await response.aclose()
        await transport.aclose()

    asyncio.run(scenario())
