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

The proxy's data path skips even the httpx objects: :meth:`FastTransport.open` takes a
prepared request head and body and returns an :class:`UpstreamResponse` (status, raw
headers, body chunks), raising the same httpx exceptions. ``httpx.Request``/``Response``
construction, header normalisation and the ``aiter_raw`` generator layers cost more CPU
per request than the rest of the exchange. Read timeouts are one lazily re-armed timer
per connection instead of an ``asyncio.timeout`` scope per wait (per SSE chunk).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
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
        self.timer: asyncio.TimerHandle | None = None
        self._reset()

    def _reset(self) -> None:
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_complete = False
        self.chunks: deque[bytes] = deque()
        self.waiter: asyncio.Future[None] | None = None
        self.wait_started = 0.0
        self.wait_timeout: float | None = None
        self.wait_what = ""
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
        self._disarm()
        if not self.complete:
            self._fail(httpx.RemoteProtocolError(
                "peer closed connection without sending complete message body"
                if self.head_complete else "server disconnected without sending a response"))

    # ----- httptools callbacks -----------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        # Read now: llhttp resets its flags once the message completes.
        self.keep_alive = self.parser.should_keep_alive()
        self.head_complete = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        if len(self.chunks) > PAUSE_CHUNKS and self.transport is not None and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self._wake()

    # ----- waiting with a read timeout ---------------------------------------------------
    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: Exception) -> None:
        self.error = error
        self._wake()

    async def _wait(self, timeout: float | None, what: str) -> None:
        """Until the next parser event, at most ``timeout`` s (then ``httpx.ReadTimeout``).

        One timer per connection, armed lazily: when it fires it fails the waiter if the
        current wait has lasted ``timeout``, else re-arms for the current wait's deadline.
        Waits start later and later, so an armed timer never fires too late."""
        waiter = self.waiter = self.loop.create_future()
        self.wait_timeout = timeout
        if timeout is not None:
            self.wait_started = self.loop.time()
            self.wait_what = what
            if self.timer is None:
                self.timer = self.loop.call_at(self.wait_started + timeout, self._on_timer)
        await waiter

    def _on_timer(self) -> None:
        self.timer = None
        waiter, timeout = self.waiter, self.wait_timeout
        if waiter is None or waiter.done() or timeout is None:
            return
        deadline = self.wait_started + timeout
        if self.loop.time() >= deadline:
            waiter.set_exception(httpx.ReadTimeout(self.wait_what))
        else:
            self.timer = self.loop.call_at(deadline, self._on_timer)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    async def wait_head(self, timeout: float | None) -> None:
        while not self.head_complete:
            if self.error is not None:
                raise self.error
            await self._wait(timeout, "no response headers from the upstream in time")

    async def next_chunk(self, timeout: float | None) -> bytes | None:
        """The next body chunk as received (None at the end of the body)."""
        while True:
            if self.chunks:
                return self.take_chunk()
            if self.complete:
                return None
            if self.error is not None:
                raise self.error
            await self._wait(timeout, "no data from the upstream in time")

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
        self._disarm()
        if self.transport is not None:
            self.transport.close()


class UpstreamResponse:
    """Status, raw headers and body of one upstream answer (see :meth:`FastTransport.open`).

    ``aclose()`` must be called: it returns the connection to the pool (or closes it)."""

    __slots__ = ("conn", "headers", "key", "pool", "read_timeout", "released", "status_code")

    def __init__(self, pool: FastTransport, key: tuple[str, int], conn: _Connection,
                 read_timeout: float | None) -> None:
        self.pool, self.key, self.conn, self.read_timeout = pool, key, conn, read_timeout
        self.status_code: int = conn.parser.get_status_code()
        self.headers = conn.headers
        self.released = False

    def header(self, name: bytes, default: bytes) -> bytes:
        """The first value of header ``name`` (lower case), or ``default``."""
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return default

    def next_chunk(self) -> Awaitable[bytes | None]:
        """The next body chunk as it arrived (None at the end); httpx errors on failure."""
        return self.conn.next_chunk(self.read_timeout)

    @property
    def finished(self) -> bool:
        """The whole body has arrived and been taken."""
        return self.conn.complete and not self.conn.chunks

    def take_queued(self) -> bytes:
        """Whatever body bytes have already arrived, without waiting (maybe b"")."""
        chunks = self.conn.chunks
        if not chunks:
            return b""
        if len(chunks) == 1:
            return self.conn.take_chunk() or b""
        parts = []
        while chunks:
            parts.append(self.conn.take_chunk() or b"")
        return b"".join(parts)

    async def read(self) -> bytes:
        """The whole body, content-encoding decoded (as ``httpx.Response.aread``)."""
        parts = []
        conn, timeout = self.conn, self.read_timeout
        while (chunk := await conn.next_chunk(timeout)) is not None:
            parts.append(chunk)
        data = b"".join(parts)
        encoding = self.header(b"content-encoding", b"identity").strip().lower()
        if encoding != b"identity" and data:  # the engine ignored accept-encoding: identity
            data = httpx.Response(self.status_code, headers=self.headers, content=data).content
        return data

    async def aclose(self) -> None:
        if self.released:
            return
        self.released = True
        conn = self.conn
        conn._disarm()
        if conn.reusable():
            self.pool.release(self.key, conn)
        else:
            conn.close()


class HttpxUpstream:
    """An ``httpx.Response`` (https instances, via httpx's own transport) with the
    :class:`UpstreamResponse` interface."""

    __slots__ = ("chunks", "response", "status_code")

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.status_code = response.status_code
        self.chunks = response.aiter_raw()

    def header(self, name: bytes, default: bytes) -> bytes:
        value = self.response.headers.get(name.decode("latin-1"))
        return default if value is None else value.encode("latin-1")

    async def next_chunk(self) -> bytes | None:
        try:
            return await self.chunks.__anext__()
        except StopAsyncIteration:
            return None

    finished = False  # httpx's stream says so only by ending

    def take_queued(self) -> bytes:
        return b""

    async def read(self) -> bytes:
        return await self.response.aread()

    async def aclose(self) -> None:
        await self.response.aclose()


Upstream = UpstreamResponse | HttpxUpstream


@dataclass(frozen=True, slots=True)
class Target:
    """One upstream endpoint, prepared once (URL parsing and the fixed part of the head)."""

    url: httpx.URL
    key: tuple[str, int]
    head: bytes  # request line, Host and the fixed headers, each line CRLF-terminated
    fixed_headers: tuple[tuple[bytes, bytes], ...]
    connect_timeout: float | None
    read_timeout: float | None


def make_target(url: str, headers: Sequence[tuple[bytes, bytes]], connect_timeout: float | None,
                read_timeout: float | None) -> Target:
    parsed = httpx.URL(url)
    lines = [b"POST " + parsed.raw_path + b" HTTP/1.1\r\n", b"Host: " + parsed.netloc + b"\r\n"]
    lines += [name + b": " + value + b"\r\n" for name, value in headers]
    return Target(parsed, (parsed.host, parsed.port or 80), b"".join(lines), tuple(headers),
                  connect_timeout, read_timeout)


class _Body(httpx.AsyncByteStream):
    """An :class:`UpstreamResponse` body as httpx's stream (for the shared client)."""

    def __init__(self, response: UpstreamResponse) -> None:
        self.response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        response = self.response
        while (chunk := await response.next_chunk()) is not None:
            yield chunk

    async def aclose(self) -> None:
        await self.response.aclose()


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
        timeouts = request.extensions.get("timeout", {})
        body = await request.aread()
        head = _request_head(request, len(body))
        response = await self.open((url.host, url.port or 80), head, body,
                                   timeouts.get("connect"), timeouts.get("read"))
        return httpx.Response(response.status_code, headers=response.headers,
                              stream=_Body(response), extensions={"http_version": b"HTTP/1.1"})

    async def post(self, target: Target, headers: Sequence[tuple[bytes, bytes]],
                   body: bytes, on_sent: Callable[[], None] | None = None) -> Upstream:
        """POST ``body`` to ``target`` with its fixed headers plus ``headers``; returns once
        the response head is in (httpx exceptions on failure, as ``open``). ``on_sent``:
        see ``open``."""
        if target.url.scheme != "http":
            if on_sent is not None:
                on_sent()
            request = httpx.Request(
                "POST", target.url, content=body,
                headers=[*target.fixed_headers, *headers],
                extensions={"timeout": {"connect": target.connect_timeout,
                                        "read": target.read_timeout, "write": 30.0,
                                        "pool": target.connect_timeout}})
            return HttpxUpstream(await self.fallback.handle_async_request(request))
        head = b"".join([target.head, *[name + b": " + value + b"\r\n" for name, value in headers],
                         b"Content-Length: %d\r\n\r\n" % len(body)])
        return await self.open(target.key, head, body, target.connect_timeout,
                               target.read_timeout, on_sent)

    async def open(self, key: tuple[str, int], head: bytes, body: bytes,
                   connect_timeout: float | None, read_timeout: float | None,
                   on_sent: Callable[[], None] | None = None) -> UpstreamResponse:
        """Send ``head`` + ``body`` (a complete HTTP/1.1 request, Content-Length included)
        to ``key`` = (host, port) on a pooled connection; return once the response head is
        in. Raises httpx's ``ConnectError``, ``ConnectTimeout``, ``ReadTimeout``,
        ``RemoteProtocolError``.

        ``on_sent`` is called once, with no await before it: right after the request is
        written to an idle pooled connection, or before waiting for a new connection. A
        caller's bookkeeping there is off the request's way to the engine yet done before
        any other task runs."""
        notify = on_sent or _nothing
        conn = self._idle(key)
        reused = conn is not None
        if conn is None:
            notify()
            notify = _nothing
            conn = await self._connect(key, connect_timeout)
        try:
            await self._send(conn, head, body, read_timeout, notify)
        except httpx.RemoteProtocolError:
            if not (reused and conn.received == 0):
                raise
            # The server closed an idle keep-alive connection as we reused it: the request
            # never reached it, so one retry on a fresh connection is safe.
            conn = await self._connect(key, connect_timeout)
            await self._send(conn, head, body, read_timeout, _nothing)
        return UpstreamResponse(self, key, conn, read_timeout)

    async def _send(self, conn: _Connection, head: bytes, body: bytes,
                    read_timeout: float | None, on_sent: Callable[[], None]) -> None:
        conn.start_request()
        assert conn.transport is not None
        conn.transport.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            conn.transport.write(body)
        on_sent()
        try:
            await conn.wait_head(read_timeout)
        except BaseException:
            conn.close()
            raise

    def _idle(self, key: tuple[str, int]) -> _Connection | None:
        stack = self.idle.get(key)
        while stack:
            conn = stack.pop()
            if not conn.closed:
                return conn
        return None

    async def _connect(self, key: tuple[str, int],
                       connect_timeout: float | None) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(connect_timeout):
                _, conn = await loop.create_connection(_Connection, key[0], key[1])
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connect to {key[0]}:{key[1]} timed out") from None
        except OSError as error:
            raise httpx.ConnectError(str(error) or "connection failed") from None
        return conn

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


def _nothing() -> None:
    return None


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
