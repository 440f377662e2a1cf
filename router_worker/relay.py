"""The engine's answer relayed to the client: whole, or as a stream of SSE events.

Bodies are forwarded byte for byte (never re-serialised); SSE chunks are written to the
client as they arrive, whole events only (:class:`~router_worker.sse.SseFramer`). An answer
that fails before its first byte reached the client comes back as an
:class:`~router_worker.failures.UpstreamFailure` (the dispatch step may retry it); one that
fails mid-stream ends the client's stream with one SSE error event in vLLM's error shape
and ``[DONE]``. The plan hears of every step (first token, failure, done); what is counted
or struck for it is its observers' business.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from router_worker.access import Detail
from router_worker.connections import DisconnectWatch
from router_worker.continuation import Splice, assemble_answer, engine_error_event
from router_worker.errors import ErrorShape, Send
from router_worker.failures import (
    UpstreamFailure,
    bad_response,
    past_deadline,
    transport_failure,
)
from router_worker.plan import Plan
from router_worker.sse import MalformedStream, SseFramer
from router_worker.upstream import ResponseDeadline, ResponseTooLarge, Upstream

# A content token in a chunk: a non-empty "content" (chat), "text" (completions, and a
# Messages text_delta) or "delta" (a Responses output_text.delta).
_TOKEN_RE = re.compile(rb'"(?:content|text|delta)":"(?!")')
# Output tokens in a usage object: chat and completions' name, then Responses' and Messages'.
_USAGE_RE = re.compile(rb'"(?:completion_tokens|output_tokens)":\s*(\d+)')
_CACHED_RE = re.compile(rb'"cached_tokens":\s*(\d+)')
HEAD_BYTES = 512  # where an answer's id is, in any of vLLM's shapes


class StreamMeter:
    """Counts content tokens in SSE chunks; notes first and last token times."""

    __slots__ = ("cached_tokens", "last_token_at", "tokens", "usage_tokens")

    def __init__(self) -> None:
        self.tokens = 0
        self.usage_tokens: int | None = None
        self.cached_tokens: int | None = None
        self.last_token_at: float | None = None

    def feed(self, chunk: bytes) -> int:
        found = len(_TOKEN_RE.findall(chunk))
        if found:
            self.tokens += found
            self.last_token_at = time.perf_counter()
        if b'"usage":{' in chunk:
            self._usage(chunk)
        return found

    def _usage(self, data: bytes) -> None:
        match = _USAGE_RE.search(data)
        if match:
            self.usage_tokens = int(match.group(1))
        cached = _CACHED_RE.search(data)
        if cached:
            self.cached_tokens = int(cached.group(1))

    @property
    def output_tokens(self) -> int:
        return self.usage_tokens if self.usage_tokens is not None else self.tokens


@dataclass(slots=True)
class Exchange:
    """One request on its way through the router: the routed plan and what the HTTP side
    needs to send it upstream and answer the client."""

    plan: Plan
    path: str
    raw: bytes  # the client's body, forwarded byte for byte
    stream: bool
    headers: list[tuple[bytes, bytes]]  # the client's headers passed on upstream
    send: Send
    watch: DisconnectWatch
    detail: Detail
    shape: ErrorShape = "openai"  # the error bodies' shape: Anthropic's on /v1/messages
    # Told the head of the engine's answer (its first events, or its body's first bytes):
    # how the router learns a Responses answer's id.
    on_head: Callable[[bytes], None] | None = None
    # The answer streamed so far, across attempts (continuations join it).
    meter: StreamMeter = field(default_factory=StreamMeter)
    splice: Splice | None = None
    chat: bool = False  # /v1/chat/completions (else /v1/completions)
    # Its answer can be continued elsewhere if it breaks (chat and completions; the
    # Responses and Messages APIs' answers are not: router_worker.continuation)
    continuable: bool = True
    # The client asked for one body; the engine is asked for a stream (so that a death can
    # be continued), which the router keeps and answers as one body once it has all of it.
    assembled: bool = False
    prompt_tokens: int = 0  # its prompt as the router counted it (for a usage that was lost)

    def end_stream(self, *, status: int, ok: bool) -> None:
        """The streamed answer ended for the client: the plan is done with it."""
        meter = self.meter
        self.plan.done(
            status=status,
            ok=ok,
            output_tokens=meter.output_tokens,
            last_token_at=meter.last_token_at,
            cached_tokens=meter.cached_tokens,
        )


async def relay_whole(ex: Exchange, response: Upstream) -> UpstreamFailure | None:
    """Read the engine's whole answer and send it on; None once the client has it."""
    plan, send = ex.plan, ex.send
    try:
        data = await response.read()
    except ResponseDeadline as error:
        return past_deadline(error)
    except httpx.TimeoutException:
        return UpstreamFailure("timeout", "no complete answer in time")
    except ResponseTooLarge as error:  # the request asked for it (n, logprobs): final
        return UpstreamFailure(error.limit, f"{error} (router.max_response_bytes)", final=True)
    except httpx.TransportError as error:
        return transport_failure(error)
    clock = plan.clock
    if clock is not None:
        clock.event = time.perf_counter()
    if not _json_object_shaped(data):
        return await bad_response(response, "a body that is not a JSON object", data)
    if ex.on_head is not None and response.status_code < 400:
        ex.on_head(data[:HEAD_BYTES])
    usage = _USAGE_RE.search(data)
    cached = _CACHED_RE.search(data)
    headers = [
        (b"content-type", response.header(b"content-type", b"application/json")),
        (b"content-length", str(len(data)).encode()),
        *route_headers(ex),
    ]
    ex.watch.done = True
    await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": data})
    if clock is not None:
        clock.relayed = time.perf_counter()
    plan.done(
        status=response.status_code,
        ok=response.status_code < 400,
        output_tokens=int(usage.group(1)) if usage else 0,
        last_token_at=None,
        cached_tokens=int(cached.group(1)) if cached else None,
    )
    return None


async def relay_stream(ex: Exchange, response: Upstream) -> UpstreamFailure | None:
    """Relay the engine's stream from its first complete events; None once it ended for
    the client. A continuation (``ex.splice.joining``) joins the client's answer. A
    failure once the client has bytes comes back as an :class:`UpstreamFailure` with
    ``streamed`` set: the dispatch step continues the answer or ends it."""
    plan = ex.plan
    framer = SseFramer(plan.runtime.config.router.max_event_bytes)
    try:
        first = await _first_events(response, framer)
        if first is None:
            return UpstreamFailure("empty", "the engine closed the stream without data")
    except ResponseDeadline as error:
        return past_deadline(error)
    except httpx.TimeoutException:
        return UpstreamFailure("timeout", "no first byte in time")
    except httpx.TransportError as error:
        return transport_failure(error)
    except MalformedStream as error:
        return UpstreamFailure(error.limit, str(error))
    splice = ex.splice
    if splice is None:
        splice = ex.splice = Splice()
        if ex.on_head is not None:
            ex.on_head(first[:HEAD_BYTES])
        await _start_stream(ex, response)
    else:
        plan.settled()  # a continuation's bytes go to the client: it cannot move either
        first = splice.join(first)
    try:
        await _relay_events(ex, response, framer, first, splice)
    except (httpx.TransportError, httpx.TimeoutException, MalformedStream) as error:
        return _mid_stream_failure(plan, error, ex.detail)
    ex.watch.done = True
    if ex.assembled:
        await send_assembled(ex)
    ex.end_stream(status=200, ok=True)
    return None


async def send_assembled(ex: Exchange) -> None:
    """The kept events of an assembled answer sent as one body in vLLM's non-streamed
    shape."""
    assert ex.splice is not None
    plan = ex.plan
    if plan.clock is not None:  # its stages as a whole answer's: the event is all of it
        plan.clock.event = time.perf_counter()
    data = assemble_answer(b"".join(ex.splice.relayed), ex.chat, ex.prompt_tokens)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(data)).encode()),
        *route_headers(ex),
    ]
    await ex.send({"type": "http.response.start", "status": 200, "headers": headers})
    await ex.send({"type": "http.response.body", "body": data})
    if plan.clock is not None:
        plan.clock.relayed = time.perf_counter()


async def _start_stream(ex: Exchange, response: Upstream) -> None:
    """The client's response starts (an assembled one with its whole body, at the end):
    from here on the request cannot move (migration)."""
    plan = ex.plan
    plan.settled()  # the answer is the client's from here on: no migration any more
    if plan.clock is not None:
        plan.clock.event = time.perf_counter()
    if ex.assembled:
        return
    headers = [
        (b"content-type", response.header(b"content-type", b"text/event-stream")),
        (b"cache-control", b"no-cache"),
        *route_headers(ex),
    ]
    await ex.send({"type": "http.response.start", "status": 200, "headers": headers})


async def _relay_events(
    ex: Exchange, response: Upstream, framer: SseFramer, out: bytes, splice: Splice
) -> None:
    """Forward whole events until the engine's body ends (ending the client's too)."""
    last = response.finished
    while True:
        if last:
            # The engine's body is complete: this is the last piece, and it carries
            # the end of the response (one write instead of two).
            out += splice.rewrite(framer.finish())
        if out or last:
            await _forward(ex, splice, out, not last)
        if last:
            return
        chunk = await response.next_chunk()
        if chunk is None:
            out, last = b"", True
            continue
        # Chunks that queued up while the client was being written to go out as one
        # write (SSE is a byte stream; event boundaries are in the bytes).
        more = response.take_queued()
        out = framer.feed(chunk + more if more else chunk)
        if out and engine_error_event(out):
            raise MalformedStream("the engine reported an error mid-stream", "engine_error")
        out = splice.rewrite(out)
        last = response.finished


async def _forward(ex: Exchange, splice: Splice, chunk: bytes, more: bool) -> None:
    plan = ex.plan
    first = ex.meter.feed(chunk) and plan.awaiting_first_token
    splice.record(chunk)
    if ex.assembled:  # kept for the one body the client gets at the end
        if first:
            plan.first_token_sent()
        limit = plan.runtime.config.router.max_response_bytes
        if splice.kept_bytes > limit:
            raise ResponseTooLarge(f"the answer is over {limit} bytes", "response_too_large")
        return
    await ex.send({"type": "http.response.body", "body": chunk, "more_body": more})
    clock = plan.clock
    if clock is not None and not clock.relayed:
        clock.relayed = time.perf_counter()
    if first:  # accounted once the token is on its way to the client
        plan.first_token_sent()


async def _first_events(response: Upstream, framer: SseFramer) -> bytes | None:
    """The stream's first complete events (None: it ended without any)."""
    while True:
        chunk = await response.next_chunk()
        if chunk is None:
            return framer.finish() or None
        more = response.take_queued()
        out = framer.feed(chunk + more if more else chunk)
        if out:
            return out


def _mid_stream_failure(plan: Plan, error: Exception, detail: Detail) -> UpstreamFailure:
    """A stream that broke after the client had bytes of it: ``streamed``, and its text
    that of the error event the client gets if it is not continued. Past the deadline is
    no fault of the engine's (``final``: no breaker strike, no continuation)."""
    if isinstance(error, ResponseDeadline):
        kind = "response_deadline"
    elif isinstance(error, MalformedStream | ResponseTooLarge):
        kind = error.limit
    else:
        kind = "mid_stream"
    deadline = kind == "response_deadline"
    return UpstreamFailure(
        kind,
        _mid_stream_message(plan, error, detail),
        # Past the deadline or over the size an assembled answer may have: the request's
        # doing, not the engine's (ResponseTooLarge).
        final=deadline or kind == "response_too_large",
        status=504 if deadline else 502,
        streamed=True,
        detail=f"stream broke: {error!r}",
    )


def route_headers(ex: Exchange) -> list[tuple[bytes, bytes]]:
    """The response headers that say where and why the request went (as the client's
    rights allow)."""
    plan, detail = ex.plan, ex.detail
    headers = [(b"x-switchyard-request-id", plan.request_id.encode())]
    if detail >= Detail.ROUTE:
        headers += [
            (b"x-switchyard-instance", plan.instance.encode()),
            (b"x-switchyard-policy", plan.arm.policy_kind.encode()),
            (b"x-switchyard-arm", plan.arm.name.encode()),
            (b"x-switchyard-reason", plan.reason.encode()),
        ]
        if plan.split is not None:  # a disaggregated cluster: the stage that answered
            headers.append((b"x-switchyard-stage", plan.stage.encode()))
            if plan.prefill_instance is not None:
                headers.append((b"x-switchyard-prefill-instance", plan.prefill_instance.encode()))
            if plan.stage == "decode" and plan.arm.stages is not None:
                kind = plan.arm.stages.decode_policy.kind
                headers.append((b"x-switchyard-decode-policy", kind.encode()))
    if detail >= Detail.DEBUG:
        scores = json.dumps(plan.decision.score_table(), separators=(",", ":"))
        headers.append((b"x-switchyard-scores", scores.encode()))
        headers.append((b"x-switchyard-cached-tokens", str(plan.decision.cached_tokens).encode()))
    return headers


def _mid_stream_message(plan: Plan, error: Exception, detail: Detail) -> str:
    """The error event's text; it names the instance only to a debug client (the route
    headers, which name it too, may be withheld from this client)."""
    engine = f"The engine {plan.instance}" if detail >= Detail.DEBUG else "The engine"
    if isinstance(error, ResponseTooLarge):
        return f"The engine's answer is too large: {error} (router.max_response_bytes)"
    if isinstance(error, ResponseDeadline | MalformedStream):
        return f"{engine}'s stream was cut: {error}"
    return f"{engine} failed mid-stream: {type(error).__name__}"


def _json_object_shaped(data: bytes) -> bool:
    """Starts with ``{`` and ends with ``}`` (whitespace aside): tells an HTML page or noise
    from a JSON answer without parsing (or copying) a body of up to max_response_bytes."""
    return data[:64].lstrip()[:1] == b"{" and data[-64:].rstrip()[-1:] == b"}"
