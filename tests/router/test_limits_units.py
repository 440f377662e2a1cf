"""Resource limits of the router's data path, unit by unit: the SSE check, the upstream
transport's size and time limits, fd exhaustion, the config knobs."""

from __future__ import annotations

import asyncio
import errno
import os
import resource

import httpx
import pytest

from router_worker.contract.config import ConfigError, parse_config
from router_worker.sse import MalformedStream, SseFramer
from router_worker.upstream import (
    FastTransport,
    LocalExhaustion,
    ResponseDeadline,
    ResponseTooLarge,
    is_local_exhaustion,
    make_target,
)

EVENT = b'data: {"choices":[{"text":" a"}]}\n\n'
MINIMAL = {
    "instances": [{"name": "i0", "url": "http://127.0.0.1:9"}],
    "policy": {"kind": "round_robin"},
}


# ----- SSE -----------------------------------------------------------------------------
def test_whole_events_pass_and_a_partial_event_waits_for_its_end():
    framer = SseFramer(1024)
    assert framer.feed(EVENT) == EVENT
    assert framer.feed(EVENT[:10]) == b""
    assert framer.feed(EVENT[10:] + EVENT[:5]) == EVENT
    assert framer.feed(EVENT[5:] + b"data: [DONE]\n\n") == EVENT + b"data: [DONE]\n\n"
    assert framer.feed(b": keep-alive\r\n\r\nevent: x\nid: 3\nretry: 5\n\n") != b""
    assert framer.feed(b"data: [DONE]") == b""
    assert framer.finish() == b"data: [DONE]\n\n"


@pytest.mark.parametrize(
    "garbage",
    [
        b"<html><body>502 Bad Gateway</body></html>\n\n",
        b"data: not json\n\n",
        b'data: {"choices": [\n\n',
        b"\x00\xff\xfe\n\n",
    ],
)
def test_garbage_is_refused(garbage):
    framer = SseFramer(1024)
    assert framer.feed(EVENT) == EVENT
    with pytest.raises(MalformedStream) as refused:
        framer.feed(garbage)
    assert refused.value.limit == "bad_response"


def test_an_event_that_never_ends_is_refused_at_the_limit():
    framer = SseFramer(1024)
    framer.feed(b'data: {"text": "')
    with pytest.raises(MalformedStream) as refused:
        for _ in range(100):
            framer.feed(b"x" * 64)
    assert refused.value.limit == "event_too_large"


# ----- upstream transport ----------------------------------------------------------------
class RawServer:
    """Loopback HTTP server answering every request with ``respond(writer)``."""

    def __init__(self, respond) -> None:
        self.respond = respond
        self.server: asyncio.base_events.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
            await reader.readexactly(length)
            await self.respond(writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1/completions"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()


async def _huge_head(writer: asyncio.StreamWriter) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n")
    for k in range(2000):
        writer.write(b"x-junk-%d: %s\r\n" % (k, b"j" * 100))
        await writer.drain()
    writer.write(b"content-length: 2\r\n\r\n{}")
    await writer.drain()


async def _big_body(writer: asyncio.StreamWriter) -> None:
    body = b"{" + b" " * 200_000 + b"}"
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(body), body)
    )
    await writer.drain()


async def _chunked_big_body(writer: asyncio.StreamWriter) -> None:
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    for _ in range(50):
        writer.write(b"1000\r\n" + b" " * 4096 + b"\r\n")
        await writer.drain()
    writer.write(b"0\r\n\r\n")
    await writer.drain()


async def _drip_forever(writer: asyncio.StreamWriter) -> None:
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    for _ in range(10_000):
        writer.write(b"%x\r\n%s\r\n" % (len(EVENT), EVENT))
        await writer.drain()
        await asyncio.sleep(0.02)


async def _post(url: str, transport: FastTransport, deadline_s: float | None = None):
    target = make_target(url, [], 1.0, 1.0, deadline_s)
    return await transport.post(target, [], b"{}")


def test_a_response_head_over_the_limit_is_refused():
    async def scenario() -> None:
        transport = FastTransport()
        transport.configure(max_header_bytes=64 * 1024, max_body_bytes=1024**2)
        async with RawServer(_huge_head) as url:
            with pytest.raises(ResponseTooLarge) as refused:
                await _post(url, transport)
        assert refused.value.limit == "response_headers_too_large"
        await transport.aclose()

    asyncio.run(scenario())


@pytest.mark.parametrize("respond", [_big_body, _chunked_big_body])
def test_a_body_over_the_limit_is_refused(respond):
    async def scenario() -> None:
        transport = FastTransport()
        transport.configure(max_header_bytes=64 * 1024, max_body_bytes=100_000)
        async with RawServer(respond) as url:
            response = await _post(url, transport)
            with pytest.raises(ResponseTooLarge) as refused:
                await response.read()
            await response.aclose()
        assert refused.value.limit == "response_too_large"
        await transport.aclose()

    asyncio.run(scenario())


def test_a_dripping_stream_ends_at_its_total_deadline():
    """Chunks every 20 ms never trip the 1 s read timeout; the 0.3 s deadline ends it."""

    async def scenario() -> int:
        transport = FastTransport()
        chunks = 0
        async with RawServer(_drip_forever) as url:
            response = await _post(url, transport, deadline_s=0.3)
            with pytest.raises(ResponseDeadline):
                while await response.next_chunk() is not None:
                    chunks += 1
            await response.aclose()
        await transport.aclose()
        return chunks

    assert asyncio.run(scenario()) > 1


def test_running_out_of_file_descriptors_is_not_a_connect_error_of_the_engine():
    async def scenario() -> None:
        transport = FastTransport()
        async with RawServer(_big_body) as url:
            lowest_free = os.dup(0)
            os.close(lowest_free)
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))
            try:
                with pytest.raises(LocalExhaustion) as refused:
                    await _post(url, transport)
            finally:
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert is_local_exhaustion(refused.value)
        await transport.aclose()

    asyncio.run(scenario())
    wrapped = httpx.ConnectError("connect failed")
    wrapped.__cause__ = OSError(errno.EMFILE, "Too many open files")
    assert is_local_exhaustion(wrapped)
    assert not is_local_exhaustion(httpx.ConnectError("All connection attempts failed"))


# ----- configuration ---------------------------------------------------------------------
def test_limit_defaults_suit_long_llm_streams():
    settings = parse_config(MINIMAL).router
    assert settings.response_deadline_s >= 3600  # long generations are normal
    assert settings.response_deadline_s >= settings.first_byte_timeout_s
    assert 0 < settings.header_timeout_s <= settings.body_timeout_s
    assert settings.max_connections >= settings.max_concurrency


@pytest.mark.parametrize(
    ("router", "named"),
    [
        ({"response_deadline_s": 10, "first_byte_timeout_s": 30}, "first_byte_timeout_s"),
        ({"header_timeout_s": 0}, "router.header_timeout_s"),
        ({"body_timeout_s": -1}, "router.body_timeout_s"),
        ({"max_connections": 0}, "router.max_connections"),
        ({"max_response_bytes": 10}, "router.max_response_bytes"),
        ({"max_response_header_bytes": 10}, "router.max_response_header_bytes"),
        ({"max_event_bytes": 10}, "router.max_event_bytes"),
    ],
)
def test_limits_are_validated_naming_the_field(router, named):
    with pytest.raises(ConfigError) as refused:
        parse_config({**MINIMAL, "router": router})
    assert named in str(refused.value)
    assert "Extra inputs" not in str(refused.value)
