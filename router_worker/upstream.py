"""The upstream HTTP/1.1 transport behind the router's one shared ``httpx.AsyncClient``.

Why not httpx's default transport: httpcore's pool walks every connection (and asks
each idle one's socket whether it is readable) on every request and every release, so
its cost per request grows with the number of open connections (measured: the upstream
pool rows of bench/router_overhead/README.md) — a router holding hundreds of streams would
spend its time in the pool. This
transport keeps an idle stack per origin (O(1) acquire and release), parses responses
with ``httptools`` (the C parser uvicorn uses) in an ``asyncio.Protocol`` and hands body
chunks to httpx as they arrive, so SSE relays chunk by chunk.

It plugs in as ``httpx.AsyncClient(transport=FastTransport())``: the client API,
``httpx.Timeout`` and the exception classes (``ConnectError``, ``ConnectTimeout``,
``ReadTimeout``, ``RemoteProtocolError``, ``ReadError``) are httpx's own. Scope: plain
``http://`` HTTP/1.1 with keep-alive, which is what vLLM serves; anything else is
delegated to httpx's default transport.

The router's data path skips even the httpx objects: :meth:`FastTransport.open` takes a
prepared request head and body and returns an :class:`UpstreamResponse` (status, raw
headers, body chunks), raising the same httpx exceptions. ``httpx.Request``/``Response``
construction, header normalisation and the ``aiter_raw`` generator layers cost more CPU
per request than the rest of the exchange. Read timeouts are one lazily re-armed timer
per connection instead of an ``asyncio.timeout`` scope per wait (per SSE chunk).

Limits: a response head larger than ``max_header_bytes`` fails with
:class:`ResponseTooLarge` (so does a body over ``max_body_bytes`` read whole with
``read()``); a request given a ``deadline_s`` fails with :class:`ResponseDeadline` once
that much time has passed since it was sent, however steadily the engine drips bytes (the
same timer as the read timeout); a connect that fails because *this process* is out of
file descriptors or local ports raises :class:`LocalExhaustion`, which says nothing about
the engine.
"""

from __future__ import annotations

import asyncio
import errno
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httptools
import httpx

from router_worker.stages import StageClock

MAX_IDLE_PER_ORIGIN = 1024
PAUSE_CHUNKS = 256  # stop reading from the engine when the client lags this far behind
DEFAULT_MAX_HEADER_BYTES = 64 * 1024
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
# errno values that mean the router itself is out of a resource, not that the peer failed.
LOCAL_EXHAUSTION_ERRNOS = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.EADDRNOTAVAIL}
)


class ResponseTooLarge(httpx.RemoteProtocolError):
    """The engine's response head or body is over the router's limit."""

    def __init__(self, message: str, limit: str) -> None:
        super().__init__(message)
        self.limit = limit  # response_headers_too_large | response_too_large


class ResponseDeadline(httpx.ReadTimeout):
    """The response took longer than its total deadline (``deadline_s``)."""


class LocalExhaustion(httpx.ConnectError):
    """The router could not open a connection for want of its *own* resources (file
    descriptors, local ports, buffers): no fault of the engine's."""


def is_local_exhaustion(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it) is the router's own resource exhaustion."""
    seen: BaseException | None = error
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, LocalExhaustion) or (
            isinstance(seen, OSError) and seen.errno in LOCAL_EXHAUSTION_ERRNOS
        ):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class _StopParsing(Exception):
    """Raised from a parser callback to abandon the response (the error is already set)."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection; parses one response at a time."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.paused = False
        self.parser = httptools.HttpResponseParser(self)
        self.timer: asyncio.TimerHandle | None = None
        self.max_header_bytes = DEFAULT_MAX_HEADER_BYTES
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
        self.header_bytes = 0
        self.deadline: float | None = None  # loop time by which the response must be done
        self.deadline_s = 0.0

    def start_request(self, max_header_bytes: int, deadline_s: float | None) -> None:
        self._reset()
        self.parser = httptools.HttpResponseParser(self)
        self.max_header_bytes = max_header_bytes
        if deadline_s is not None:
            self.deadline_s = deadline_s
            self.deadline = self.loop.time() + deadline_s

    # ----- asyncio.Protocol ------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as error:
            if self.error is None:
                self._fail(httpx.RemoteProtocolError(f"invalid HTTP response: {error}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._disarm()
        if not self.complete:
            self._fail(
                httpx.RemoteProtocolError(
                    "peer closed connection without sending complete message body"
                    if self.head_complete
                    else "server disconnected without sending a response"
                )
            )

    # ----- httptools callbacks -----------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_bytes += len(name) + len(value) + 4
        if self.header_bytes > self.max_header_bytes:
            self._fail(
                ResponseTooLarge(
                    f"the engine's response head is over {self.max_header_bytes} bytes",
                    "response_headers_too_large",
                )
            )
            raise _StopParsing
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
        """Until the next parser event, at most ``timeout`` s (then ``httpx.ReadTimeout``)
        and never past the request's deadline (then :class:`ResponseDeadline`).

        One timer per connection, armed lazily: when it fires it fails the waiter if the
        current wait has lasted ``timeout`` or the deadline has passed, else re-arms for
        the current wait's due time. Waits start later and later (and the deadline is
        fixed per request), so an armed timer never fires too late."""
        waiter = self.waiter = self.loop.create_future()
        self.wait_timeout = timeout
        if timeout is not None or self.deadline is not None:
            self.wait_started = self.loop.time()
            self.wait_what = what
            if self.timer is None:
                self.timer = self.loop.call_at(self._due(), self._on_timer)
        await waiter

    def _due(self) -> float:
        due = math.inf if self.deadline is None else self.deadline
        if self.wait_timeout is not None:
            due = min(due, self.wait_started + self.wait_timeout)
        return due

    def _on_timer(self) -> None:
        self.timer = None
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        now = self.loop.time()
        if self.deadline is not None and now >= self.deadline:
            waiter.set_exception(self._deadline_error())
        elif self.wait_timeout is not None and now >= self.wait_started + self.wait_timeout:
            waiter.set_exception(httpx.ReadTimeout(self.wait_what))
        elif self.wait_timeout is not None or self.deadline is not None:
            self.timer = self.loop.call_at(self._due(), self._on_timer)

    def _deadline_error(self) -> ResponseDeadline:
        return ResponseDeadline(
            f"the answer took longer than its {self.deadline_s:g} s "
            "deadline (router.response_deadline_s)"
        )

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
                if self.deadline is not None and self.loop.time() >= self.deadline:
                    raise self._deadline_error()
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

    __slots__ = (
        "conn",
        "headers",
        "key",
        "max_body",
        "pool",
        "read_timeout",
        "released",
        "status_code",
    )

    def __init__(
        self,
        pool: FastTransport,
        key: tuple[str, int],
        conn: _Connection,
        read_timeout: float | None,
    ) -> None:
        self.pool, self.key, self.conn, self.read_timeout = pool, key, conn, read_timeout
        self.max_body = pool.max_body_bytes
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
        """The whole body, content-encoding decoded (as ``httpx.Response.aread``); at most
        ``max_body`` bytes (else :class:`ResponseTooLarge`)."""
        parts = []
        conn, timeout = self.conn, self.read_timeout
        declared = self.header(b"content-length", b"0")
        size = int(declared) if declared.isdigit() else 0
        if size > self.max_body:
            raise _body_too_large(self.max_body)
        size = 0
        while (chunk := await conn.next_chunk(timeout)) is not None:
            size += len(chunk)
            if size > self.max_body:
                raise _body_too_large(self.max_body)
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

    __slots__ = ("chunks", "deadline", "max_body", "response", "status_code")

    def __init__(self, response: httpx.Response, max_body: int, deadline: float | None) -> None:
        self.response = response
        self.status_code = response.status_code
        self.chunks = response.aiter_raw()
        self.max_body = max_body
        self.deadline = deadline  # event-loop time

    def header(self, name: bytes, default: bytes) -> bytes:
        value = self.response.headers.get(name.decode("latin-1"))
        return default if value is None else value.encode("latin-1")

    async def next_chunk(self) -> bytes | None:
        try:
            async with asyncio.timeout_at(self.deadline):
                return await self.chunks.__anext__()
        except StopAsyncIteration:
            return None
        except TimeoutError:
            raise ResponseDeadline(
                "the answer took longer than its deadline (router.response_deadline_s)"
            ) from None

    finished = False  # httpx's stream says so only by ending

    def take_queued(self) -> bytes:
        return b""

    async def read(self) -> bytes:
        parts, size = [], 0
        while (chunk := await self.next_chunk()) is not None:
            size += len(chunk)
            if size > self.max_body:
                raise _body_too_large(self.max_body)
            parts.append(chunk)
        data = b"".join(parts)
        if data and self.header(b"content-encoding", b"identity").strip().lower() != b"identity":
            data = httpx.Response(
                self.status_code, headers=self.response.headers, content=data
            ).content
        return data

    async def aclose(self) -> None:
        await self.response.aclose()
        unbind(self.response)


Upstream = UpstreamResponse | HttpxUpstream


def unbind(response: httpx.Response) -> None:
    """Let go of a closed response's stream. httpx 0.28 binds a response's stream to the
    response (to stamp ``elapsed`` on close): a reference cycle per response, which only
    the cyclic GC frees. The router's scrapes and probes then piled up for a minute and
    went in one ~50 ms pause of the event loop."""
    response.stream = httpx.ByteStream(b"")


class AcyclicClient(httpx.AsyncClient):
    """``httpx.AsyncClient`` whose read responses are freed as soon as they are dropped
    (:func:`unbind`); a streamed one is unbound by whoever closes it."""

    async def send(self, request: httpx.Request, **kwargs: Any) -> httpx.Response:
        response = await super().send(request, **kwargs)
        if not kwargs.get("stream", False):
            unbind(response)
        return response


def _body_too_large(limit: int) -> ResponseTooLarge:
    return ResponseTooLarge(f"the engine's answer is over {limit} bytes", "response_too_large")


@dataclass(frozen=True, slots=True)
class Target:
    """One upstream endpoint, prepared once (URL parsing and the fixed part of the head)."""

    url: httpx.URL
    key: tuple[str, int]
    head: bytes  # request line, Host and the fixed headers, each line CRLF-terminated
    fixed_headers: tuple[tuple[bytes, bytes], ...]
    connect_timeout: float | None
    read_timeout: float | None
    deadline_s: float | None = None  # total time for the answer, from sending the request


def make_target(
    url: str,
    headers: Sequence[tuple[bytes, bytes]],
    connect_timeout: float | None,
    read_timeout: float | None,
    deadline_s: float | None = None,
) -> Target:
    parsed = httpx.URL(url)
    lines = [b"POST " + parsed.raw_path + b" HTTP/1.1\r\n", b"Host: " + parsed.netloc + b"\r\n"]
    lines += [name + b": " + value + b"\r\n" for name, value in headers]
    return Target(
        parsed,
        (parsed.host, parsed.port or 80),
        b"".join(lines),
        tuple(headers),
        connect_timeout,
        read_timeout,
        deadline_s,
    )


class _Body(httpx.AsyncByteStream):
    """An :class:`UpstreamResponse` body as httpx's stream (for the shared client)."""

    def __init__(self, response: UpstreamResponse) -> None:
        self.response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        response, size = self.response, 0
        while (chunk := await response.next_chunk()) is not None:
            size += len(chunk)
            if size > response.max_body:
                raise _body_too_large(response.max_body)
            yield chunk

    async def aclose(self) -> None:
        await self.response.aclose()


class FastTransport(httpx.AsyncBaseTransport):
    """Per-origin LIFO keep-alive pools of ``_Connection`` (see module docstring)."""

    def __init__(self, max_idle_per_origin: int = MAX_IDLE_PER_ORIGIN) -> None:
        self.max_idle = max_idle_per_origin
        self.idle: dict[tuple[str, int], list[_Connection]] = {}
        self.fallback = httpx.AsyncHTTPTransport()
        self.max_header_bytes = DEFAULT_MAX_HEADER_BYTES
        self.max_body_bytes = DEFAULT_MAX_BODY_BYTES

    def configure(self, max_header_bytes: int, max_body_bytes: int) -> None:
        """Limits on what an engine may send: a response head, a body read whole."""
        self.max_header_bytes, self.max_body_bytes = max_header_bytes, max_body_bytes

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme != "http":
            return await self.fallback.handle_async_request(request)
        timeouts = request.extensions.get("timeout", {})
        body = await request.aread()
        head = _request_head(request, len(body))
        response = await self.open(
            (url.host, url.port or 80), head, body, timeouts.get("connect"), timeouts.get("read")
        )
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_Body(response),
            extensions={"http_version": b"HTTP/1.1"},
        )

    async def post(
        self,
        target: Target,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
        on_sent: Callable[[], None] | None = None,
        clock: StageClock | None = None,
    ) -> Upstream:
        """POST ``body`` to ``target`` with its fixed headers plus ``headers``; returns once
        the response head is in (httpx exceptions on failure, as ``open``). ``on_sent``
        and ``clock``: see ``open``."""
        if target.url.scheme != "http":
            return await self._post_fallback(target, headers, body, on_sent)
        head = b"".join(
            [
                target.head,
                *[name + b": " + value + b"\r\n" for name, value in headers],
                b"Content-Length: %d\r\n\r\n" % len(body),
            ]
        )
        return await self.open(
            target.key,
            head,
            body,
            target.connect_timeout,
            target.read_timeout,
            on_sent,
            target.deadline_s,
            clock,
        )

    async def _post_fallback(
        self,
        target: Target,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
        on_sent: Callable[[], None] | None,
    ) -> Upstream:
        """https (or anything not plain http) through httpx's own transport."""
        if on_sent is not None:
            on_sent()
        request = httpx.Request(
            "POST",
            target.url,
            content=body,
            headers=[*target.fixed_headers, *headers],
            extensions={
                "timeout": {
                    "connect": target.connect_timeout,
                    "read": target.read_timeout,
                    "write": 30.0,
                    "pool": target.connect_timeout,
                }
            },
        )
        loop = asyncio.get_running_loop()
        deadline = None if target.deadline_s is None else loop.time() + target.deadline_s
        try:
            async with asyncio.timeout_at(deadline):
                response = await self.fallback.handle_async_request(request)
        except TimeoutError:
            raise ResponseDeadline(
                "no answer within the deadline (router.response_deadline_s)"
            ) from None
        except httpx.ConnectError as error:
            if is_local_exhaustion(error):
                raise LocalExhaustion(str(error)) from error
            raise
        return HttpxUpstream(response, self.max_body_bytes, deadline)

    async def open(
        self,
        key: tuple[str, int],
        head: bytes,
        body: bytes,
        connect_timeout: float | None,
        read_timeout: float | None,
        on_sent: Callable[[], None] | None = None,
        deadline_s: float | None = None,
        clock: StageClock | None = None,
    ) -> UpstreamResponse:
        """Send ``head`` + ``body`` (a complete HTTP/1.1 request, Content-Length included)
        to ``key`` = (host, port) on a pooled connection; return once the response head is
        in. Raises httpx's ``ConnectError``, ``ConnectTimeout``, ``ReadTimeout``,
        ``RemoteProtocolError``.

        ``on_sent`` is called once, with no await before it: right after the request is
        written to an idle pooled connection, or before waiting for a new connection. A
        caller's bookkeeping there is off the request's way to the engine yet done before
        any other task runs.

        ``clock``, when given, is stamped when the connection is in hand, when the request
        is written and when the response head is in (``stages``)."""
        notify = on_sent or _nothing
        conn = self._idle(key)
        reused = conn is not None
        if conn is None:
            notify()
            notify = _nothing
            conn = await self._connect(key, connect_timeout)
        try:
            await self._send(conn, head, body, read_timeout, notify, deadline_s, clock)
        except httpx.RemoteProtocolError as error:
            if isinstance(error, ResponseTooLarge) or not (reused and conn.received == 0):
                raise
            # The server closed an idle keep-alive connection as we reused it: the request
            # never reached it, so one retry on a fresh connection is safe.
            conn = await self._connect(key, connect_timeout)
            await self._send(conn, head, body, read_timeout, _nothing, deadline_s, clock)
        return UpstreamResponse(self, key, conn, read_timeout)

    async def _send(
        self,
        conn: _Connection,
        head: bytes,
        body: bytes,
        read_timeout: float | None,
        on_sent: Callable[[], None],
        deadline_s: float | None,
        clock: StageClock | None = None,
    ) -> None:
        if clock is not None:
            clock.connected = time.perf_counter()
        conn.start_request(self.max_header_bytes, deadline_s)
        assert conn.transport is not None
        conn.transport.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            conn.transport.write(body)
        if clock is not None:
            clock.sent = time.perf_counter()
        on_sent()
        try:
            await conn.wait_head(read_timeout)
        except BaseException:
            conn.close()
            raise
        if clock is not None:
            clock.head = time.perf_counter()

    def _idle(self, key: tuple[str, int]) -> _Connection | None:
        stack = self.idle.get(key)
        while stack:
            conn = stack.pop()
            if not conn.closed:
                return conn
        return None

    async def _connect(self, key: tuple[str, int], connect_timeout: float | None) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(connect_timeout):
                _, conn = await loop.create_connection(_Connection, key[0], key[1])
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connect to {key[0]}:{key[1]} timed out") from None
        except OSError as error:
            if error.errno in LOCAL_EXHAUSTION_ERRNOS:
                raise LocalExhaustion(
                    f"the router is out of resources to connect to {key[0]}:{key[1]}: {error}"
                ) from None
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
