"""Engine answers over the router's limits, through a live router; and the head deadline on
a kept-alive client connection.

One instance is a misbehaving engine on loopback (this file's ``BadEngine``), the other
a real enginesim instance. A response head over ``max_response_header_bytes`` is the
engine's fault: retried on the other instance, the client never notices. A body over
``max_response_bytes`` is what the request asked for: a clear 502, not retried.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading

import httpx
import pytest

from devharness import Fleet, Router
from tests.drills.clients import MODEL, is_error_body
from tests.router.helpers import router_config, scrape_total

JSON_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"


class BadEngine:
    """Serves /health, /metrics and /v1/models; every POST gets ``answer``."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self.posts = 0
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self.thread.start()
        ready.wait(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        self.loop.run_forever()
        server.close()
        tasks = asyncio.all_tasks(self.loop)
        for task in tasks:
            task.cancel()
        self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self.loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    ),
                    0,
                )
                await reader.readexactly(length)
                writer.write(self._answer(head.split(b" ", 2)[:2]))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def _answer(self, request_line: list[bytes]) -> bytes:
        method, path = request_line
        if method == b"POST":
            self.posts += 1
            return self.answer
        body = b""
        if path == b"/v1/models":
            body = b'{"object": "list", "data": [{"id": "%s"}]}' % MODEL.encode()
        return JSON_HEAD % len(body) + b"\r\n" + body

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def huge_head() -> bytes:
    junk = b"".join(b"x-junk-%d: %s\r\n" % (k, b"j" * 100) for k in range(1000))
    return JSON_HEAD % 2 + junk + b"\r\n{}"


def huge_body() -> bytes:
    body = b'{"choices": [{"text": "' + b"a" * 300_000 + b'"}]}'
    return JSON_HEAD % len(body) + b"\r\n" + body


@pytest.fixture
def bad_engine():
    engines: list[BadEngine] = []

    def start(answer: bytes) -> BadEngine:
        engines.append(BadEngine(answer))
        return engines[-1]

    yield start
    for engine in engines:
        engine.stop()


def _router(router_factory, fleet: Fleet, bad: BadEngine) -> Router:
    return router_factory(
        {
            "model": MODEL,
            "policy": {"kind": "round_robin"},
            "instances": [{"name": "bad", "url": bad.url}, {"name": "good", "url": fleet.url(0)}],
            "router": {
                "kv_events": False,
                "health_interval_s": 0.2,
                "scrape_interval_s": 0.2,
                "max_response_bytes": 100_000,
                "max_response_header_bytes": 16_384,
            },
        }
    )


def _limit_hits(router: Router, limit: str) -> float:
    return scrape_total(router.url, "switchyard_router_limit_hits_total", limit=limit)


def test_an_engine_head_over_the_limit_is_retried_elsewhere(fleet, router_factory, bad_engine):
    bad = bad_engine(huge_head())
    router = _router(router_factory, fleet, bad)
    payload = {"model": MODEL, "prompt": "hello", "max_tokens": 4}
    answers = [
        httpx.post(router.url + "/v1/completions", json=payload, timeout=30) for _ in range(6)
    ]
    assert [a.status_code for a in answers] == [200] * 6
    assert {a.headers["x-switchyard-instance"] for a in answers} == {"good"}
    assert bad.posts > 0
    assert _limit_hits(router, "response_headers_too_large") == bad.posts


def test_an_engine_body_over_the_limit_is_a_clear_502_not_retried(
    fleet, router_factory, bad_engine
):
    bad = bad_engine(huge_body())
    router = _router(router_factory, fleet, bad)
    payload = {"model": MODEL, "prompt": "hello", "max_tokens": 4}
    answers = [
        httpx.post(router.url + "/v1/completions", json=payload, timeout=30) for _ in range(4)
    ]
    refused = [a for a in answers if a.status_code != 200]
    assert len(refused) == bad.posts > 0  # each answer of the bad engine, none retried
    for answer in refused:
        assert answer.status_code == 502 and is_error_body(answer.text)
        assert "max_response_bytes" in answer.json()["error"]["message"]
    assert _limit_hits(router, "response_too_large") == bad.posts
    assert router.health_of("bad") == "healthy"  # the request asked for it: no strike


def html_413() -> bytes:
    page = b"<html><body><h1>413 Request Entity Too Large</h1>nginx</body></html>"
    return (
        b"HTTP/1.1 413 Request Entity Too Large\r\ncontent-type: text/html\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(page), page)
    )


def test_a_foreign_error_page_becomes_an_openai_error_with_its_status(
    fleet, router_factory, bad_engine
):
    """A proxy's HTML error page in front of an engine says something about the request:
    the client gets that status as an OpenAI-style error, and no breaker counts it."""
    bad = bad_engine(html_413())
    router = _router(router_factory, fleet, bad)
    payload = {"model": MODEL, "prompt": "hello", "max_tokens": 4, "stream": True}
    answers = [
        httpx.post(router.url + "/v1/completions", json=payload, timeout=30) for _ in range(8)
    ]
    refused = [a for a in answers if a.status_code != 200]
    assert len(refused) == bad.posts > 0
    for answer in refused:
        assert answer.status_code == 413 and is_error_body(answer.text)
        assert "413 Request Entity Too Large" in answer.json()["error"]["message"]
    assert router.health_of("bad") == "healthy"


def _read_answer(sock: socket.socket) -> bytes:
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = sock.recv(65536)
        if not chunk:
            break
        received += chunk
    head, _, rest = received.partition(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        ),
        0,
    )
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return head + b"\r\n\r\n" + rest


def test_a_kept_alive_connection_has_the_head_deadline_for_every_request(fleet, router_factory):
    document = router_config(fleet)
    document["router"]["header_timeout_s"] = 0.5
    router = router_factory(document)
    with socket.create_connection(("127.0.0.1", router.port), timeout=10) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        assert _read_answer(sock).startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\nx-never-ends: ")
        answer = _read_answer(sock)
        assert sock.recv(1) == b""  # and the router closed the connection
    head, _, text = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408") and b"connection: close" in head
    assert "header_timeout_s" in json.loads(text)["error"]["message"]
