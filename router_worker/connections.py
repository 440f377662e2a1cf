"""Client connections: a cap on how many are open and a deadline for each request head.

uvicorn's httptools protocol has neither: a connection that never completes a request
head holds a file descriptor for ever (no timer runs before the first request), and
nothing bounds how many connections are open, so a flood of idle or slowly-typed
connections (slowloris) uses up the process's file descriptors, and then the router can
neither accept clients nor connect to engines.

The router runs uvicorn with ``http=guarded_protocol(guard)``, a subclass of that
protocol which

* arms a timer when a connection opens and when a new request's first byte arrives; a
  head not complete within ``header_timeout_s`` is answered 408 (OpenAI-style JSON) and
  the connection closed;
* answers a connection beyond the cap at once with 503 (OpenAI-style JSON,
  ``connection: close``) without reading its request, half-closes it, discards what the
  client still sends and closes it when the client does, or after
  ``REFUSED_LINGER_S`` (closing a socket with unread input would reset the connection
  and could destroy the answer before the client reads it). The cap is
  ``max_connections``, never more than half of the process's file-descriptor limit: the
  other half is for upstream connections.

The request *body* deadline is the data path's (``limits.BodyDeadline``).
"""

from __future__ import annotations

import asyncio
import resource
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from router_worker.errors import error_bytes
from router_worker.metrics import RouterMetrics

REFUSED_LINGER_S = 1.0
_STATUS_LINES = {408: b"HTTP/1.1 408 Request Timeout\r\n",
                 503: b"HTTP/1.1 503 Service Unavailable\r\n"}


class ConnectionGuard:
    """The limits the protocol applies, updated when a configuration is applied."""

    def __init__(self, metrics: RouterMetrics, max_connections: int = 4096,
                 header_timeout_s: float = 15.0) -> None:
        self.metrics = metrics
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self.open: set[Any] = set()
        metrics.connections.set_function(lambda: len(self.open))

    def configure(self, max_connections: int, header_timeout_s: float) -> None:
        self.max_connections, self.header_timeout_s = max_connections, header_timeout_s

    def cap(self) -> int:
        """``max_connections``, at most half the current file-descriptor limit (read each
        time: an operator may change it on a running process with ``prlimit``)."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return self.max_connections
        return max(1, min(self.max_connections, soft // 2))


def raw_error(status: int, message: str) -> bytes:
    """A complete HTTP/1.1 error response that closes the connection."""
    body = error_bytes(status, message)
    retry = b"retry-after: 1\r\n" if status == 503 else b""
    return b"".join([_STATUS_LINES[status], b"content-type: application/json\r\n",
                     b"content-length: %d\r\n" % len(body), retry,
                     b"connection: close\r\n\r\n", body])


def guarded_protocol(guard: ConnectionGuard) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with the guard's cap and head deadline."""

    class GuardedProtocol(HttpToolsProtocol):
        head_timer: asyncio.TimerHandle | None = None
        refused = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            guard.open.add(self)
            cap = guard.cap()
            if len(guard.open) > cap:
                self._refuse(cap)
                return
            self._arm_head_timer()

        def _refuse(self, cap: int) -> None:
            guard.metrics.limit_hit("connections")
            self.refused = True
            self.transport.write(raw_error(
                503, f"The router has too many open connections (cap {cap}, "
                     "router.max_connections); retry later."))
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.loop.call_later(REFUSED_LINGER_S, self.transport.close)

        def data_received(self, data: bytes) -> None:
            if not self.refused:
                super().data_received(data)

        def eof_received(self) -> None:
            if self.refused:
                self.transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            guard.open.discard(self)
            self._disarm_head_timer()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm_head_timer()

        def on_headers_complete(self) -> None:
            self._disarm_head_timer()
            super().on_headers_complete()

        def _arm_head_timer(self) -> None:
            if self.head_timer is None:
                self.head_timer = self.loop.call_later(guard.header_timeout_s,
                                                       self._head_timed_out)

        def _disarm_head_timer(self) -> None:
            if self.head_timer is not None:
                self.head_timer.cancel()
                self.head_timer = None

        def _head_timed_out(self) -> None:
            self.head_timer = None
            if self.transport.is_closing():
                return
            guard.metrics.limit_hit("header_timeout")
            self.transport.write(raw_error(
                408, f"The request head did not arrive within {guard.header_timeout_s:g} s "
                     "(router.header_timeout_s)."))
            self.transport.close()

    return GuardedProtocol
