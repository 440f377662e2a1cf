"""How an attempt at an engine fails, as the request path tells it: :class:`UpstreamFailure`
and the helpers that make one from what the engine (or the socket) did.

A failure before any byte reached the client can be retried (the retry rule of
``routing.lifecycle``); the circuit breaker, the failure metrics and the log hear of it
through the plan's observers (:mod:`router_worker.observers`), from the attempt's
``error``, ``detail`` and ``final``.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from router_worker.access import Detail
from router_worker.upstream import Upstream


@dataclass(slots=True)
class UpstreamFailure:
    """An attempt that failed: before any byte reached the client (so it can be retried),
    or ``streamed`` (so it can be continued)."""

    # connect | timeout | http_5xx | transport | empty | one of observers.LIMIT_KINDS
    kind: str
    message: str
    # Not the instance's fault, and another would fare no better (the router out of file
    # descriptors, an answer over the router's size or time limit): no retry, no strike.
    final: bool = False
    status: int = 502
    # The client already had bytes of the answer (a stream broken midway): ``message`` is
    # the text of the error event it gets unless the answer is continued.
    streamed: bool = False
    detail: str = ""  # the log's words for it, when not ``message``


# What a client without the debug right is told of a failed attempt whose own text comes
# from the socket layer (it quotes the engine's address, e.g. "Connect call failed
# ('10.0.0.7', 8000)").
SOCKET_FAILURE_TEXT = {
    "connect": "could not connect to the engine",
    "transport": "the connection to the engine failed",
}


def failure_text(failure: UpstreamFailure, detail: Detail) -> str:
    if detail >= Detail.DEBUG:
        return failure.message
    return SOCKET_FAILURE_TEXT.get(failure.kind, failure.message)


def out_of_resources(error: Exception) -> UpstreamFailure:
    return UpstreamFailure(
        "fd_exhausted",
        f"The router is out of file descriptors or local ports; retry later ({error}).",
        final=True,
        status=503,
    )


def past_deadline(error: Exception) -> UpstreamFailure:
    return UpstreamFailure(
        "response_deadline", f"The engine's answer took too long: {error}.", final=True, status=504
    )


def transport_failure(error: httpx.TransportError) -> UpstreamFailure:
    return UpstreamFailure("transport", str(error) or type(error).__name__)


def unexpected_media_type(response: Upstream, stream: bool) -> str | None:
    """The answer's media type unless it is the one due: ``text/event-stream`` for a
    stream's 200, ``application/json`` otherwise."""
    expected = (
        b"text/event-stream" if stream and response.status_code == 200 else b"application/json"
    )
    media = response.header(b"content-type", b"").split(b";", 1)[0].strip().lower()
    return None if media == expected else media.decode("latin-1")


async def bad_response(response: Upstream, what: str, data: bytes | None = None) -> UpstreamFailure:
    """An answer not in the shape due (an HTML page from a proxy in between, noise) is
    never relayed. A success so shaped means a broken instance: retried elsewhere and held
    against it. An error status so shaped (a proxy's 413 page, say) is more likely about
    the request, which every instance would answer alike: the client gets that status
    with an OpenAI-style body, and no breaker counts it (as with suspected requests)."""
    status = response.status_code
    if status < 400:
        return UpstreamFailure("bad_response", f"the engine answered HTTP {status} with {what}")
    detail = (
        data[:200].decode("utf-8", "replace") if data is not None else await safe_read(response)
    )
    return UpstreamFailure(
        "bad_response",
        f"The engine answered HTTP {status} with {what}: {detail}",
        final=True,
        status=status,
    )


async def safe_read(response: Upstream) -> str:
    """The start of an error answer's body, or nothing if it cannot be read."""
    try:
        return (await response.read())[:200].decode("utf-8", "replace")
    except httpx.HTTPError:
        return ""
