"""The upstream HTTP/1.1 transport behind the router's one shared ``httpx.AsyncClient``.

Why not httpx's default transport: httpcore's pool walks every connection (and asks
each idle one's socket whether it is readable) on every request and every release, so
its cost per request grows with the number of open connections. Measured on this
machine against a trivial uvicorn app: 967 req/s with 1 connection, 159 with 32, 54 with
200 — a router holding hundreds of streams would spend its time in the pool. This
transport keeps an idle stack per origin (O(1) acquire and release), parses responses
with ``httptools`` (the C parser uvicorn uses) in an ``asyncio.Protocol`` and hands body
chunks to httpx as they arrive, so SSE relays chunk by chunk.

It plugs in as ``httpx.AsyncClient(transport=FastTransport())``: the client API,
``httpx.Timeout`` and the exception classes (``ConnectError``, ``ConnectTimeout``,
``ReadTimeout``, ``RemoteProtocolError``, ``ReadError``) are httpx's own. Scope: plain
``http://`` HTTP/1.1 with keep-alive, which is what vLLM serves; anything else is
delegated to httpx's default transport.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import httptools
import httpx

MAX_IDLE_PER_ORIGIN = 1024
PAUSE_CHUNKS = 256  # stop reading from the engine when the client lags this far behind


class _Connection(asyncio.Protocol):
    """One keep-alive connection; parses one response at a time."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.paused = False
        self.parser = httptools.HttpResponseParser(self)
        self._reset()

    def _reset(self) -> None:
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_done: asyncio.Future[None] = self.loop.create_future()
        self.chunks: deque[bytes] = deque()
        self.waiter: asyncio.Future[None] | None = None
        self.complete = False
        self.error: Exception | None = None
        self.received = 0
        self.keep_alive = False

    def start_request(self) -> None:
        self._reset()
        self.parser = httptools.HttpResponseParser(self)

    # ----- asyncio.Protocol ------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as error:
            self._fail(httpx.RemoteProtocolError(f"invalid HTTP response: {error}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.complete:
            self._fail(httpx.RemoteProtocolError(
                "peer closed connection without sending complete message body"
                if self.head_done.done() else "server disconnected without sending a response"))

    # ----- httptools callbacks -----------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        # Read now: llhttp resets its flags once the message completes.
        self.keep_alive = self.parser.should_keep_alive()
        if not self.head_done.done():
            self.head_done.set_result(None)

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        if len(self.chunks) > PAUSE_CHUNKS and self.transport is not None and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self._wake()

    # ----- helpers -----------------------------------------------------------------------
    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: Exception) -> None:
        self.error = error
        if not self.head_done.done():
            self.head_done.set_exception(error)
            self.head_done.exception()  # mark retrieved: nobody may be waiting any more
        self._wake()

    def take_chunk(self) -> bytes | None:
        if not self.chunks:
            return None
        chunk = self.chunks.popleft()
        if self.paused and len(self.chunks) < PAUSE_CHUNKS // 2 and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return chunk

    def reusable(self) -> bool:
        return self.complete and not self.closed and not self.chunks and self.keep_alive

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class _Body(httpx.AsyncByteStream):
    def __init__(self, pool: FastTransport, key: tuple[str, int], conn: _Connection,
                 read_timeout: float | None) -> None:
        self.pool, self.key, self.conn, self.read_timeout = pool, key, conn, read_timeout
        self.released = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn = self.conn
        while True:
            chunk = conn.take_chunk()
            if chunk is not None:
                yield chunk
                continue
            if conn.complete:
                return
            if conn.error is not None:
                raise conn.error
            conn.waiter = conn.loop.create_future()
            try:
                async with asyncio.timeout(self.read_timeout):
                    await conn.waiter
            except TimeoutError:
                raise httpx.ReadTimeout("no data from the upstream in time") from None

    async def aclose(self) -> None:
        if self.released:
            return
        self.released = True
        if self.conn.reusable():
            self.pool.release(self.key, self.conn)
        else:
            self.conn.close()


class FastTransport(httpx.AsyncBaseTransport):
    """Per-origin LIFO keep-alive pools of ``_Connection`` (see module docstring)."""

    def __init__(self, max_idle_per_origin: int = MAX_IDLE_PER_ORIGIN) -> None:
        self.max_idle = max_idle_per_origin
        self.idle: dict[tuple[str, int], list[_Connection]] = {}
        self.fallback = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme != "http":
            return await self.fallback.handle_async_request(request)
        key = (url.host, url.port or 80)
        timeouts = request.extensions.get("timeout", {})
        body = await request.aread()
        head = _request_head(request, len(body))
        conn, reused = await self._acquire(key, timeouts.get("connect"))
        try:
            await self._send(conn, head, body, timeouts.get("read"))
        except httpx.RemoteProtocolError:
            if not (reused and conn.received == 0):
                raise
            # The server closed an idle keep-alive connection as we reused it: the request
            # never reached it, so one retry on a fresh connection is safe.
            conn, _ = await self._acquire(key, timeouts.get("connect"), fresh=True)
            await self._send(conn, head, body, timeouts.get("read"))
        status = conn.parser.get_status_code()
        return httpx.Response(status, headers=conn.headers,
                              stream=_Body(self, key, conn, timeouts.get("read")),
                              extensions={"http_version": b"HTTP/1.1"})

    async def _send(self, conn: _Connection, head: bytes, body: bytes,
                    read_timeout: float | None) -> None:
        conn.start_request()
        assert conn.transport is not None
        conn.transport.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            conn.transport.write(body)
        try:
            async with asyncio.timeout(read_timeout):
                await asyncio.shield(conn.head_done)
        except TimeoutError:
            conn.close()
            raise httpx.ReadTimeout("no response headers from the upstream in time") from None
        except BaseException:
            conn.close()
            raise

    async def _acquire(self, key: tuple[str, int], connect_timeout: float | None,
                       fresh: bool = False) -> tuple[_Connection, bool]:
        stack = self.idle.get(key)
        while stack and not fresh:
            conn = stack.pop()
            if not conn.closed:
                return conn, True
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(connect_timeout):
                _, conn = await loop.create_connection(_Connection, key[0], key[1])
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connect to {key[0]}:{key[1]} timed out") from None
        except OSError as error:
            raise httpx.ConnectError(str(error) or "connection failed") from None
        return conn, False

    def release(self, key: tuple[str, int], conn: _Connection) -> None:
        stack = self.idle.setdefault(key, [])
        if len(stack) >= self.max_idle:
            conn.close()
            return
        stack.append(conn)

    async def aclose(self) -> None:
        for stack in self.idle.values():
            for conn in stack:
                conn.close()
        self.idle.clear()
        await self.fallback.aclose()


def _request_head(request: httpx.Request, body_length: int) -> bytes:
    target = request.url.raw_path
    lines = [request.method.encode() + b" " + target + b" HTTP/1.1\r\n"]
    has_length = False
    for name, value in request.headers.raw:
        lower = name.lower()
        if lower == b"transfer-encoding":
            continue  # the body is sent whole, with a Content-Length
        if lower == b"content-length":
            has_length = True
            value = str(body_length).encode()
        lines.append(name + b": " + value + b"\r\n")
    if not has_length and (body_length or request.method in ("POST", "PUT", "PATCH")):
        lines.append(b"Content-Length: " + str(body_length).encode() + b"\r\n")
    lines.append(b"\r\n")
    return b"".join(lines)
