"""The load client: raw sockets parsed with httptools on uvloop, so the client stays cheap;
one keep-alive connection per worker and port, re-opened when the server closed it idle."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import httptools
import uvloop

T = TypeVar("T")


MODEL = "Qwen/Qwen2-7B-Instruct"


def run_async(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on uvloop: the client's CPU per chunk is a third of the default
    loop's, and what it does not spend the engines and routers can."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


class _Exchange:
    """httptools callbacks for one response: SSE events counted, the first token timed."""

    def __init__(self) -> None:
        self.first: float | None = None  # monotonic s at the first SSE line with a token
        self.events = 0
        self.tail = b""
        self.complete = False
        self.keep_alive = False
        self.parser: httptools.HttpResponseParser | None = None

    def on_headers_complete(self) -> None:
        # Read now: llhttp resets its flags once the message completes.
        assert self.parser is not None
        self.keep_alive = self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        # Cheap (no line splitting: the client must not be what limits the run); the
        # tail keeps a marker split between two reads.
        data = self.tail + body
        self.events += data.count(b"data: ") - self.tail.count(b"data: ")
        if self.first is None and b'"text":"' in data:
            self.first = time.monotonic()
        self.tail = data[-7:]

    def on_message_complete(self) -> None:
        self.complete = True


@dataclass(slots=True)
class Outcome:
    """One answered request, client side; times are ``time.monotonic()`` (the clock of the
    engines' ``--request-log``)."""

    request_id: str
    sent: float
    first: float | None  # first token (streams)
    done: float
    events: int  # SSE data events (0 for non-streamed answers)


class _StaleConnection(Exception):
    """The connection ended before any byte of the response."""


class Client:
    """One keep-alive connection per engine or router port, as a production client (or
    the router towards the engines) keeps: accepting a connection per request in an
    already busy enginesim would be measured as engine latency."""

    def __init__(self) -> None:
        self.connections: dict[int, tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}

    async def request(
        self, port: int, body: bytes, request_id: str, session: str | None = None
    ) -> Outcome | None:
        """Send one request with ``X-Request-Id: request_id`` (and ``X-Session-ID:
        session``); None when it failed."""
        extra = b"X-Session-ID: %s\r\n" % session.encode() if session else b""
        head = (
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nX-Request-Id: %s\r\n%s"
            b"Content-Length: %d\r\n\r\n" % (request_id.encode(), extra, len(body))
        )
        for _ in range(2):
            reused = port in self.connections
            if reused and self.connections[port][0].at_eof():
                self.drop(port)  # the server closed it while idle (keep-alive timeout)
                reused = False
            if not reused:
                self.connections[port] = await asyncio.open_connection("127.0.0.1", port)
            try:
                return await self._exchange(port, head + body, request_id)
            except _StaleConnection:
                if not reused:
                    return None
                # Closed while idle just as we sent: the request never got in; once more
                # on a fresh connection, as HTTP clients do.
        return None

    async def _exchange(self, port: int, request: bytes, request_id: str) -> Outcome | None:
        reader, writer = self.connections[port]
        exchange = _Exchange()
        parser = exchange.parser = httptools.HttpResponseParser(exchange)
        sent = time.monotonic()  # connecting is not part of a request's latency
        writer.write(request)
        received = False
        try:
            while not exchange.complete:
                data = await reader.read(65536)
                if not data:
                    raise ConnectionError("closed by the server")
                received = True
                parser.feed_data(data)
        except (ConnectionError, httptools.HttpParserError):
            self.drop(port)
            if not received:
                raise _StaleConnection from None
            return None
        if not exchange.keep_alive:
            self.drop(port)
        if parser.get_status_code() != 200:
            return None
        return Outcome(request_id, sent, exchange.first, time.monotonic(), exchange.events)

    def drop(self, port: int) -> None:
        _, writer = self.connections.pop(port)
        writer.close()

    def close(self) -> None:
        for port in list(self.connections):
            self.drop(port)


class Run:
    """One closed-loop run: what the client saw, failures and wall time."""

    def __init__(self, stream: bool) -> None:
        self.stream = stream
        self.outcomes: list[Outcome] = []
        self.failures = 0
        self.elapsed = 0.0  # seconds after the warm-up
        self.wall = 0.0  # seconds in all

    @property
    def samples(self) -> list[float]:
        """TTFT (streams) or latency (non-streamed), seconds."""
        if self.stream:
            return [o.first - o.sent for o in self.outcomes if o.first is not None]
        return [o.done - o.sent for o in self.outcomes]

    @property
    def events(self) -> int:
        return sum(o.events for o in self.outcomes)


def make_prompt(shared: str, head: str, words: int) -> str:
    """``shared`` (a common prefix, maybe empty), ``head``, then filler up to about
    ``words`` words in all (enginesim: about a token each)."""
    filler = ["lorem", "ipsum", "dolor", "sit", "amet"]
    count = words - len(shared.split()) - len(head.split())
    return shared + head + " " + " ".join(filler[k % len(filler)] for k in range(count))


def system_prompt(nonce: int, words: int) -> str:
    """A run's shared prefix (a chat app's system prompt): the same for every request of
    the run, new for each run."""
    if not words:
        return ""
    return f"system {nonce} " + " ".join(f"rule{k}" for k in range(words - 2)) + " "


async def run_loop(
    ports: list[int],
    concurrency: int,
    duration: float,
    stream: bool,
    max_tokens: int,
    prompt_words: int = 60,
    warmup: float = 0.0,
    shared_words: int = 0,
    sessions: list[str] | None = None,
) -> Run:
    """``concurrency`` workers, each sending its next request when the last one ends,
    for ``duration`` s. With ``warmup``, the workers start spread over that many seconds
    (not all at once: a burst of simultaneous arrivals is not the steady state) and what
    was sent before it ends is not kept. ``sessions[n]``: worker n's ``X-Session-ID``."""
    run = Run(stream)
    begin = time.monotonic()
    deadline = time.perf_counter() + warmup + duration
    # A fresh prefix per run: a prompt repeated from an earlier run would hit the engines'
    # prefix cache and make whichever path runs later look faster.
    nonce = time.perf_counter_ns()
    shared = system_prompt(nonce, shared_words)
    # One round robin over the ports shared by all workers, like the router's: a per-worker
    # rotation leaves some engines with more streams than others at any moment, which on a
    # prefill-bound engine doubled direct TTFT and made the router look faster than direct.
    turns = itertools.count()

    async def worker(n: int) -> None:
        k = 0
        client = Client()
        await asyncio.sleep(warmup * n / concurrency)
        while time.perf_counter() < deadline:
            request_id = f"{nonce}-{n}-{k}"
            prompt = make_prompt(shared, f"run {nonce} client {n} request {k}", prompt_words)
            body = json.dumps(
                {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": stream}
            ).encode()
            outcome = await client.request(
                ports[next(turns) % len(ports)], body, request_id, sessions[n] if sessions else None
            )
            if outcome is None:
                run.failures += 1
            elif outcome.sent >= begin + warmup:
                run.outcomes.append(outcome)
            k += 1
        client.close()

    await asyncio.gather(*(worker(n) for n in range(concurrency)))
    run.wall = time.monotonic() - begin
    run.elapsed = run.wall - warmup
    return run


async def closed_loop(
    ports: list[int], concurrency: int, duration: float, stream: bool, max_tokens: int
) -> tuple[list[float], int, float]:
    run = await run_loop(ports, concurrency, duration, stream, max_tokens)
    return run.samples, run.failures, run.elapsed
