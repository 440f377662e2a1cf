"""Client connections: a cap on how many are open, deadlines for each request's head and
body (slowloris).

uvicorn's httptools protocol has none of these: a connection that never completes a
request holds a file descriptor (and a handler waiting on its body) for ever, and nothing
bounds how many connections are open, so a flood of idle or slowly-typed connections uses
up the process's file descriptors; then the router can neither accept clients nor connect
to engines.

The router runs uvicorn with ``http=guarded_protocol(guard)``, a subclass of that
protocol which

* gives a request ``header_timeout_s`` for its head (from the connection's opening, or
  from the request's first byte on a kept-alive connection) and then ``body_timeout_s``
  for its whole body: a total deadline, so dripping bytes does not extend it. Past it the
  client gets 408 (OpenAI-style JSON, ``connection: close``) and the connection is closed;
  a handler waiting on the body sees a disconnect and ends quietly;
* answers a connection beyond the cap at once with 503 (``connection: close``,
  ``retry-after: 1``) without reading its request, half-closes it, discards what the
  client still sends and closes it when the client does, or after ``REFUSED_LINGER_S``
  (closing a socket with unread input would reset the connection, which can destroy the
  answer before the client reads it). The cap is ``max_connections``, never more than
  half the process's file-descriptor limit: the other half is for engine connections.

Cost on the hot path: no timer per request. One timer per connection, armed lazily; it
fires at most every ``min(header_timeout_s, body_timeout_s)``, acts if the current phase
is overdue, else re-arms (the read-timeout scheme of ``upstream._Connection``).

Two more things the protocol does for the data path's latency:

* uvicorn writes a response head on its own and the first body bytes with a second
  ``write``: two segments, two wake-ups for the client. :class:`HeadWithBody` holds the head
  back until the first body bytes and writes both at once (``http.response.start`` and the
  first ``http.response.body`` come back to back in every answer of the router);
* a handler that wants to hear of its client going away adds a callback to the
  :class:`Disconnects` in ``scope["extensions"][DISCONNECT]`` (and discards it when done)
  instead of running a task that waits on ``receive()``; ``connection_lost`` calls it
  (:class:`DisconnectWatch`).
"""

from __future__ import annotations

import asyncio
import resource
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from router_worker.errors import error_bytes
from router_worker.metrics import RouterMetrics

REFUSED_LINGER_S = 1.0
DISCONNECT = "switchyard.on_disconnect"
ARRIVED = "switchyard.arrived"  # perf_counter when the request's head was parsed
_TIMEOUTS = {"head": ("header_timeout", "request head"), "body": ("body_timeout", "request body")}
_STATUS_LINES = {
    408: b"HTTP/1.1 408 Request Timeout\r\n",
    503: b"HTTP/1.1 503 Service Unavailable\r\n",
}


class ConnectionGuard:
    """The limits the protocol applies, updated when a configuration is applied."""

    def __init__(
        self,
        metrics: RouterMetrics,
        max_connections: int = 4096,
        header_timeout_s: float = 15.0,
        body_timeout_s: float = 60.0,
    ) -> None:
        self.metrics = metrics
        self.open: set[Any] = set()
        self.configure(max_connections, header_timeout_s, body_timeout_s)
        metrics.connections.set_function(lambda: len(self.open))

    def configure(
        self, max_connections: int, header_timeout_s: float, body_timeout_s: float
    ) -> None:
        self.max_connections = max_connections
        self.limits = {"head": header_timeout_s, "body": body_timeout_s}
        self.tick = min(header_timeout_s, body_timeout_s)

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
    return b"".join(
        [
            _STATUS_LINES[status],
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            retry,
            b"connection: close\r\n\r\n",
            body,
        ]
    )


class Disconnects:
    """A connection's disconnect callbacks (``scope["extensions"][DISCONNECT]``): ``add`` one
    (called at once if the client has already gone), ``discard`` it when done.

    ``add`` also resumes reading from the client, as uvicorn's ``receive()`` does: a big
    body pauses reading, and a paused connection would never see its client close."""

    __slots__ = ("callbacks", "lost", "resume")

    def __init__(self, resume: Callable[[], None]) -> None:
        self.callbacks: list[Callable[[], None]] = []
        self.lost = False
        self.resume = resume

    def add(self, callback: Callable[[], None]) -> None:
        if self.lost:
            callback()
            return
        if callback not in self.callbacks:
            self.callbacks.append(callback)
        self.resume()

    def discard(self, callback: Callable[[], None]) -> None:
        if callback in self.callbacks:
            self.callbacks.remove(callback)

    def fire(self) -> None:
        self.lost = True
        callbacks, self.callbacks = self.callbacks, []
        for callback in callbacks:
            callback()


class HeadWithBody:
    """A response cycle's transport that holds the response head back until the first body
    bytes, then writes both in one ``write``. Writes before the response starts (``100
    Continue``) pass straight through; ``close`` sends a held head first."""

    __slots__ = ("cycle", "head", "passing", "transport")

    def __init__(self, transport: asyncio.Transport, cycle: Any) -> None:
        self.transport = transport
        self.cycle: Any = cycle
        self.head: bytes | None = None
        self.passing = False

    def write(self, data: bytes) -> None:
        if self.passing:
            self.transport.write(data)
        elif self.head is not None:
            self.passing = True
            self.transport.write(self.head + data)
            self.head = None
        elif self.cycle.response_started:  # uvicorn writes the head alone, first
            self.head = data
            # The cycle refers to us as its transport: a reference cycle, which only the
            # cyclic GC would free (in bulk, with a pause), and we no longer need it.
            self.cycle = None
        else:
            self.transport.write(data)

    def close(self) -> None:
        if self.head is not None:
            self.transport.write(self.head)
            self.head = None
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.transport.get_extra_info(name, default)


def guarded_protocol(guard: ConnectionGuard) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with the guard's cap and deadlines."""

    class GuardedProtocol(HttpToolsProtocol):
        timer: asyncio.TimerHandle | None = None
        phase: str | None = None  # "head" | "body" while a request is being received
        phase_started = 0.0
        refused = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.on_disconnect = Disconnects(self.flow.resume_reading)
            guard.open.add(self)
            cap = guard.cap()
            if len(guard.open) > cap:
                self._refuse(cap)
                return
            self._enter("head")

        def connection_lost(self, exc: Exception | None) -> None:
            guard.open.discard(self)
            self.phase = None
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None
            super().connection_lost(exc)
            self.on_disconnect.fire()

        def data_received(self, data: bytes) -> None:
            if not self.refused:
                super().data_received(data)

        def eof_received(self) -> None:
            if self.refused:
                self.transport.close()

        # ----- request phases (parser callbacks) ------------------------------------
        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self.phase != "head":  # the first head's clock started at the connection
                self._enter("head")

        def on_headers_complete(self) -> None:
            # One per connection: pipelined requests' handlers each add theirs.
            extensions = cast(dict[str, Any], self.scope.setdefault("extensions", {}))
            extensions[DISCONNECT] = self.on_disconnect
            extensions[ARRIVED] = time.perf_counter()
            super().on_headers_complete()
            cycle = self.cycle
            # POST only: the data path's answers, which always carry a body message (a HEAD
            # answer writes no body: its head must not wait for one). Not an upgrade either.
            if cycle is not None and cycle.scope is self.scope and self.scope["method"] == "POST":
                cycle.transport = cast(asyncio.Transport, HeadWithBody(self.transport, cycle))
            self._enter("body")

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self.phase = None

        def _enter(self, phase: str) -> None:
            self.phase = phase
            self.phase_started = self.loop.time()
            if self.timer is None:
                # Never later than any phase starting from now could fall due.
                self.timer = self.loop.call_at(self.phase_started + guard.tick, self._on_timer)

        def _on_timer(self) -> None:
            self.timer = None
            phase = self.phase
            if phase is None or self.transport.is_closing():
                return
            now = self.loop.time()
            due = self.phase_started + guard.limits[phase]
            if now < due:
                self.timer = self.loop.call_at(min(due, now + guard.tick), self._on_timer)
                return
            self._timed_out(phase)

        def _timed_out(self, phase: str) -> None:
            limit, what = _TIMEOUTS[phase]
            guard.metrics.limit_hit(limit)
            cycle = self.cycle
            # No 408 in the middle of an answer (a pipelined head behind one being
            # written) nor after one (a body still dripping in after a 413).
            if phase == "head":
                answer = cycle is None or cycle.response_complete
            else:
                answer = not cycle.response_started
            if answer:
                self.transport.write(
                    raw_error(
                        408,
                        f"The {what} did not arrive within {guard.limits[phase]:g} s "
                        f"(router.{limit}_s).",
                    )
                )
            # A handler waiting on the body sees a disconnect once the close is through.
            self.transport.close()

        def _refuse(self, cap: int) -> None:
            guard.metrics.limit_hit("connections")
            self.refused = True
            self.transport.write(
                raw_error(
                    503,
                    f"The router has too many open connections (cap {cap}, "
                    "router.max_connections); retry later.",
                )
            )
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.loop.call_later(REFUSED_LINGER_S, self.transport.close)

    return GuardedProtocol


Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]


class ClientGone(Exception):
    """The client disconnected."""


class DisconnectWatch:
    """Cancels a request's task the moment its client goes away, unless ``done`` (the
    answer is complete); ``gone`` tells the task why it was cancelled.

    Under the router's own server protocol (``connections.guarded_protocol``) the scope
    carries a list of callbacks its ``connection_lost`` calls: the watch adds itself there
    and costs nothing more. Elsewhere it runs a task that waits on ``receive()``."""

    __slots__ = ("_hooks", "_receive", "_task", "_watcher", "done", "gone")

    def __init__(
        self,
        receive: Receive,
        task: asyncio.Task[Any],
        hooks: Disconnects | None = None,
    ) -> None:
        self._receive = receive
        self._task = task
        self._hooks = hooks
        self._watcher: asyncio.Future[None] | None = None
        self.done = False
        self.gone = False

    def start(self) -> None:
        if self._hooks is not None:
            self._hooks.add(self._gone)
        elif self._watcher is None:
            self._watcher = asyncio.ensure_future(self._watch())

    def stop(self) -> None:
        self.done = True
        if self._hooks is not None:
            self._hooks.discard(self._gone)
        if self._watcher is not None:
            self._watcher.cancel()

    def _gone(self) -> None:
        if not self.done and not self.gone:
            self.gone = True
            self._task.cancel()

    async def _watch(self) -> None:
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self._gone()
                return
