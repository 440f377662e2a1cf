"""The OpenAI-compatible data path as raw ASGI: parse, route, dispatch, stream back.

Raw ASGI rather than a framework because this is the hot path: no per-request objects
beyond the ones we need. Bodies are forwarded byte for byte (never re-serialised); SSE
chunks are written to the client as they arrive from the engine.

Failure handling: a connect error, a timeout, a 5xx or a dropped connection *before the
first body byte* is retried where the arm's policy, asked again without the instances
that failed, sends it (the retry rule of ``routing.lifecycle``), up to ``max_attempts``;
the client sees nothing of it (the response starts only with the first upstream byte). A
failure mid-stream ends the stream with one SSE error event in vLLM's error shape and
``[DONE]``. A client disconnect cancels the handler at once, which closes the upstream
connection (the engine aborts the request).

Resource limits (README "Resource limits"): an answer of the wrong content type or not
shaped like JSON / SSE (``sse.SseFramer``) is a failure like a 5xx (retried before the
first byte, an SSE error event after it); an answer past ``response_deadline_s`` or over
``max_response_bytes``, and a connect that failed for want of the router's own file
descriptors, are ``final``: not retried, not held against the instance.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import httpx

from router_worker.access import Detail, client_rights, detail_for
from router_worker.connections import ARRIVED, DISCONNECT, Disconnects
from router_worker.core import RouterCore
from router_worker.errors import APIError, error_bytes, sse_error_event
from router_worker.intake import Endpoint, Intake, IntakeRunner
from router_worker.limits import Limiter
from router_worker.plan import Plan
from router_worker.runtime import Runtime
from router_worker.sse import MalformedStream, SseFramer
from router_worker.stages import StageClock
from router_worker.upstream import (
    FastTransport,
    LocalExhaustion,
    ResponseDeadline,
    ResponseTooLarge,
    Target,
    Upstream,
    make_target,
)

log = logging.getLogger("router_worker.proxy")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

ENDPOINTS: dict[str, Endpoint] = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}
JSON_TYPE = (b"content-type", b"application/json")
FORWARDED_HEADERS = ("authorization", "x-request-id", "traceparent")
FIXED_UPSTREAM_HEADERS = ((b"content-type", b"application/json"), (b"accept-encoding", b"identity"))
DEBUG_HEADER = "x-switchyard-debug"
USED_HEADERS = frozenset(
    name.encode() for name in ("content-length", "x-session-id", DEBUG_HEADER, *FORWARDED_HEADERS)
)
# A content token in an OpenAI chunk: a non-empty "content" (chat) or "text" (completions).
_TOKEN_RE = re.compile(rb'"(?:content|text)":"(?!")')
_USAGE_RE = re.compile(rb'"completion_tokens":\s*(\d+)')
_CACHED_RE = re.compile(rb'"cached_tokens":\s*(\d+)')
# Failure kinds that are resource limits: counted in switchyard_router_limit_hits_total.
LIMIT_KINDS = frozenset(
    {
        "bad_response",
        "event_too_large",
        "response_deadline",
        "response_too_large",
        "response_headers_too_large",
        "fd_exhausted",
    }
)


@dataclass(slots=True)
class UpstreamFailure:
    """An attempt that failed before any byte reached the client (so it can be retried)."""

    # connect | timeout | http_5xx | transport | empty | one of LIMIT_KINDS
    kind: str
    message: str
    fatal: bool = False  # the instance is certainly gone (connection refused)
    # Not the instance's fault, and another would fare no better (the router out of file
    # descriptors, an answer over the router's size or time limit): no retry, no strike.
    final: bool = False
    status: int = 502


# The attempt was taken back before its first byte to move the request (Plan.mover).
MIGRATED = UpstreamFailure("migrated", "moved to another instance by the policy")


@dataclass(slots=True)
class Exchange:
    """One request on its way through the proxy: the routed plan and what the HTTP side
    needs to send it upstream and answer the client."""

    plan: Plan
    path: str
    raw: bytes  # the client's body, forwarded byte for byte
    stream: bool
    headers: list[tuple[bytes, bytes]]  # the client's headers passed on upstream
    send: Send
    watch: DisconnectWatch
    detail: Detail


class ClientGone(Exception):
    """The client disconnected."""


def check_declared(declared: str | None, limit: int) -> None:
    """A ``content-length`` over the limit is refused before anything else is done."""
    if declared and declared.isdigit() and int(declared) > limit:
        raise APIError(413, f"Request body too large: {declared} bytes (limit {limit}).")


async def read_body(receive: Receive, limit: int) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise APIError(413, f"Request body too large (limit {limit} bytes).")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


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


class Proxy:
    def __init__(
        self,
        core: RouterCore,
        transport: FastTransport,
        limiter: Limiter,
        intake: IntakeRunner | None = None,
    ) -> None:
        self.core = core
        self.transport = transport
        self.limiter = limiter
        self.intake = intake or IntakeRunner(metrics=core.metrics)

    # ----- entry points -----------------------------------------------------------------
    async def models(self, scope: Scope, send: Send) -> None:
        runtime = self.core.runtime
        if runtime is not None:
            try:
                client_rights(runtime, _header(scope, b"authorization"))
            except APIError as error:
                self.core.metrics.child(self.core.metrics.rejected, str(error.status)).inc()
                await send_error(send, error)
                return
        models = self.core.allowed_models() or set()
        context = self.core.max_model_len()
        extra = {"max_model_len": context} if context else {}
        data = [
            {"id": m, "object": "model", "owned_by": "switchyard", **extra} for m in sorted(models)
        ]
        await send_json(send, 200, {"object": "list", "data": data})

    async def generate(
        self, scope: Scope, receive: Receive, send: Send, endpoint: Endpoint
    ) -> None:
        """Admission first (key, size, concurrency): a request waits for its slot before its
        body is read, so a refused or queued request holds no body, and every body read or
        taken in is bounded by the slots."""
        started = time.perf_counter()
        # Only the headers the router reads (names arrive lower-cased from the server).
        headers = {
            k.decode("latin-1"): v.decode("latin-1")
            for k, v in scope["headers"]
            if k in USED_HEADERS
        }
        core = self.core
        try:
            runtime = core.runtime
            if runtime is None:
                raise APIError(503, "The router has no configuration yet.")
            # Before the body is read: an unauthenticated client costs no more than this.
            rights = client_rights(runtime, headers.get("authorization"))
            if rights is not None:  # the router's own key is not passed on to the engines
                del headers["authorization"]
            detail = detail_for(runtime, rights, DEBUG_HEADER in headers)
            check_declared(headers.get("content-length"), runtime.config.router.max_body_bytes)
            await self.limiter.acquire()
        except APIError as error:
            core.metrics.child(core.metrics.rejected, str(error.status)).inc()
            await send_error(send, error)
            return
        try:
            await self._admitted(scope, receive, send, endpoint, runtime, headers, started, detail)
        finally:
            self.limiter.release()

    async def _admitted(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        endpoint: Endpoint,
        runtime: Runtime,
        headers: dict[str, str],
        started: float,
        detail: Detail,
    ) -> None:
        """Body, intake, then routing; from the body's end a disconnect watcher cancels us
        at once (a body waiting for an intake worker is dropped unread)."""
        task = asyncio.current_task()
        assert task is not None
        watch = DisconnectWatch(receive, task, scope.get("extensions", {}).get(DISCONNECT))
        core = self.core
        core.metrics.in_flight_count += 1
        plan: Plan | None = None
        clock = StageClock(scope.get("extensions", {}).get(ARRIVED, started))
        try:
            raw = await read_body(receive, runtime.config.router.max_body_bytes)
            clock.body = time.perf_counter()
            watch.start()
            intake = await self._take_in(raw, endpoint, runtime)
            clock.intake = time.perf_counter()
            plan = core.plan(runtime, intake, headers, started)
            plan.clock = clock
            clock.decided = time.perf_counter()
            up_headers = _upstream_headers(headers)
            path = scope["path"]
            await self._dispatch(
                Exchange(plan, path, raw, intake.stream, up_headers, send, watch, detail)
            )
        except ClientGone:
            pass
        except APIError as error:
            if plan is None:
                core.metrics.child(core.metrics.rejected, str(error.status)).inc()
            await send_error(send, error)
        except asyncio.CancelledError:
            if not watch.gone:
                raise
            task.uncancel()
            if plan is not None:  # 499: nginx's code for "client closed the request"
                plan.finish(
                    status=499,
                    ok=False,
                    output_tokens=0,
                    last_token_at=None,
                    cached_tokens=None,
                )
        finally:
            watch.stop()
            core.metrics.in_flight_count -= 1
            if plan is not None:
                plan.release()

    async def _take_in(self, raw: bytes, endpoint: Endpoint, runtime: Runtime) -> Intake:
        """The body checked, tokenized and hashed (off the loop when big), or APIError."""
        try:
            intake = await self.intake.take_in(
                raw, endpoint, runtime.tokenizer, runtime.config.block_size, runtime.config.router
            )
        except APIError:
            raise
        except Exception:  # a bug, not the client's fault: logged, answered without detail
            log.exception("taking a request body in failed")
            raise APIError(500, "The router failed to read this request.") from None
        return intake

    # ----- dispatch with retries --------------------------------------------------------
    async def _dispatch(self, ex: Exchange) -> None:
        """Send the plan's attempts until one is answered or the lifecycle's retry rule
        (``plan.fail``) gives up; the breaker bookkeeping is ours."""
        plan = ex.plan
        while True:
            try:
                failure = await self._movable_attempt(ex)
            except BaseException:
                plan.abandon()  # the client went away (or a bug): the attempt ends
                raise
            if failure is None:
                return
            if failure is MIGRATED:
                plan.migrated()
                continue
            self._count_failure(plan, failure)
            # A 5xx is noted by the lifecycle (its answered_5xx) and held against the
            # instance only later (_settle_5xx); other failures strike at once.
            if failure.kind != "http_5xx" and not failure.final:
                self._strike([plan.instance], failure.kind, fatal=failure.fatal)
            verdict = plan.fail(failure.kind, final=failure.final)
            if verdict.attempt is None:
                break
            metrics = self.core.metrics
            metrics.child(metrics.retries, verdict.attempt.instance).inc()
        poison = verdict.why == "poison"
        if not poison:
            self._settle_5xx(plan)
        self._give_up(plan, failure, poison)
        status = 504 if failure.kind == "timeout" else 502
        last = _failure_text(failure, ex.detail)
        if failure.final:
            status, message = failure.status, last
        elif poison:
            message = (
                f"The request failed on {len(plan.life.answered_5xx)} instances alike and was "
                f"not retried further; last: {last}"
            )
        else:
            message = f"All {plan.attempts} attempts failed; last: {last}"
        plan.finish(status=status, ok=False, output_tokens=0, last_token_at=None, cached_tokens=0)
        await send_error(ex.send, APIError(status, message))

    def _count_failure(self, plan: Plan, failure: UpstreamFailure) -> None:
        core = self.core
        core.metrics.child(core.metrics.upstream_errors, plan.instance, failure.kind).inc()
        if failure.kind in LIMIT_KINDS:
            core.metrics.limit_hit(failure.kind)
        log.info(
            "request %s: %s on %s: %s",
            plan.request_id,
            failure.kind,
            plan.instance,
            failure.message,
        )

    def _strike(self, instances: list[str], kind: str, *, fatal: bool = False) -> None:
        """Count a failure against each instance's circuit breaker."""
        now = time.monotonic()
        for instance in instances:
            self.core.health.record_failure(instance, now, kind, fatal=fatal)

    def _served(self, plan: Plan) -> None:
        """The attempt got a good answer: the instance is fine, and so is the request, so
        the instances that answered it with a 5xx before are to blame after all."""
        self.core.health.record_success(plan.instance)
        self._settle_5xx(plan)

    def _settle_5xx(self, plan: Plan) -> None:
        """Strike the instances that answered this request with a 5xx (the lifecycle's
        ``answered_5xx``). Once per request at most: either an attempt was served
        (``_served``) or the request was given up, never both."""
        self._strike(plan.life.answered_5xx, "http_5xx")

    def _give_up(self, plan: Plan, failure: UpstreamFailure, poison: bool) -> None:
        self.core.telemetry.event(
            "retries_exhausted",
            request_id=plan.request_id,
            attempts=plan.attempts,
            last_error=f"{failure.kind}: {failure.message}",
            instances=plan.tried,
            request_suspected=poison,
        )

    async def _movable_attempt(self, ex: Exchange) -> UpstreamFailure | None:
        """The attempt; for a migrating policy's streamed request, run as a task the
        migration registry may cancel (``plan.mover``) until the first byte: then MIGRATED
        is returned and ``plan.migrate_to`` names the instance to send the request to."""
        plan = ex.plan
        attempt = self._attempt(ex)
        if not (ex.stream and plan.arm.policy.migrates):
            return await attempt
        task = asyncio.ensure_future(attempt)
        plan.mover = task.cancel
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if plan.migrate_to is None or (current is not None and current.cancelling()):
                raise  # the client went away (or the server stops): not a migration
            return MIGRATED
        finally:
            plan.mover = None

    async def _attempt(self, ex: Exchange) -> UpstreamFailure | None:
        plan = ex.plan
        target = _upstream_target(plan.runtime, plan.instance, ex.path)
        plan.sent_at = time.perf_counter()
        try:
            # Straight to the shared transport, without httpx.Request/Response objects:
            # the client's layers and httpx's models cost more CPU than the exchange.
            response = await self.transport.post(
                target, ex.headers, ex.raw, partial(self._sent, ex), plan.clock
            )
        except LocalExhaustion as error:
            return _out_of_resources(error)
        except httpx.ConnectError as error:
            return UpstreamFailure("connect", str(error) or "connection refused", fatal=True)
        except ResponseDeadline as error:
            return _past_deadline(error)
        except httpx.TimeoutException as error:
            return UpstreamFailure("timeout", f"no answer in time ({type(error).__name__})")
        except ResponseTooLarge as error:
            return UpstreamFailure(error.limit, str(error))
        except httpx.TransportError as error:
            return UpstreamFailure("transport", str(error) or type(error).__name__)
        try:
            if response.status_code >= 500:
                body = await _safe_read(response)
                return UpstreamFailure("http_5xx", f"HTTP {response.status_code}: {body}")
            media = _unexpected_media_type(response, ex.stream)
            if media is not None:
                return await _bad_response(response, f"content type {media!r}")
            if ex.stream and response.status_code == 200:
                return await self._relay_stream(ex, response)
            return await self._relay_whole(ex, response)
        finally:
            await response.aclose()

    def _sent(self, ex: Exchange) -> None:
        """The attempt is on its way upstream: its accounting, and from now on a client
        disconnect cancels it (until then nothing waited that it could interrupt)."""
        ex.plan.sent()
        ex.watch.start()

    async def _relay_whole(self, ex: Exchange, response: Upstream) -> UpstreamFailure | None:
        plan, send = ex.plan, ex.send
        try:
            data = await response.read()
        except ResponseDeadline as error:
            return _past_deadline(error)
        except httpx.TimeoutException:
            return UpstreamFailure("timeout", "no complete answer in time")
        except ResponseTooLarge as error:  # the request asked for it (n, logprobs): final
            return UpstreamFailure(error.limit, f"{error} (router.max_response_bytes)", final=True)
        except httpx.TransportError as error:
            return UpstreamFailure("transport", str(error) or type(error).__name__)
        if plan.clock is not None:
            plan.clock.event = time.perf_counter()
        if not _json_object_shaped(data):
            return await _bad_response(response, "a body that is not a JSON object", data)
        ok = response.status_code < 400
        if ok:
            self._served(plan)
        usage = _USAGE_RE.search(data)
        cached = _CACHED_RE.search(data)
        headers = [
            (b"content-type", response.header(b"content-type", b"application/json")),
            (b"content-length", str(len(data)).encode()),
            *self._route_headers(ex),
        ]
        ex.watch.done = True
        await send(
            {"type": "http.response.start", "status": response.status_code, "headers": headers}
        )
        await send({"type": "http.response.body", "body": data})
        if plan.clock is not None:
            self.core.metrics.stages.observe(plan.clock)
        plan.finish(
            status=response.status_code,
            ok=ok,
            output_tokens=int(usage.group(1)) if usage else 0,
            last_token_at=None,
            cached_tokens=int(cached.group(1)) if cached else None,
        )
        return None

    async def _relay_stream(self, ex: Exchange, response: Upstream) -> UpstreamFailure | None:
        plan, send = ex.plan, ex.send
        framer = SseFramer(plan.runtime.config.router.max_event_bytes)
        try:
            first = await _first_events(response, framer)
            if first is None:
                return UpstreamFailure("empty", "the engine closed the stream without data")
        except ResponseDeadline as error:
            return _past_deadline(error)
        except httpx.TimeoutException:
            return UpstreamFailure("timeout", "no first byte in time")
        except httpx.TransportError as error:
            return UpstreamFailure("transport", str(error) or type(error).__name__)
        except MalformedStream as error:
            return UpstreamFailure(error.limit, str(error))
        plan.mover = None  # bytes go to the client from here on: no migration any more
        received = time.perf_counter()
        if plan.clock is not None:
            plan.clock.event = received
        self._served(plan)
        headers = [
            (b"content-type", response.header(b"content-type", b"text/event-stream")),
            (b"cache-control", b"no-cache"),
            *self._route_headers(ex),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        meter = StreamMeter()
        status, ok = 200, True
        try:
            await self._relay_events(ex, response, framer, first, meter, received)
        except (httpx.TransportError, httpx.TimeoutException, MalformedStream) as error:
            status, ok = self._mid_stream_failure(plan, error)
            ex.watch.done = True
            await send(
                {
                    "type": "http.response.body",
                    "more_body": False,
                    "body": sse_error_event(status, _mid_stream_message(plan, error, ex.detail)),
                }
            )
        else:
            ex.watch.done = True
        plan.finish(
            status=status,
            ok=ok,
            output_tokens=meter.output_tokens,
            last_token_at=meter.last_token_at,
            cached_tokens=meter.cached_tokens,
        )
        return None

    async def _relay_events(
        self,
        ex: Exchange,
        response: Upstream,
        framer: SseFramer,
        out: bytes,
        meter: StreamMeter,
        received: float,
    ) -> None:
        """Forward whole events until the engine's body ends (ending the client's too)."""
        plan = ex.plan
        last = response.finished
        while True:
            if last:
                # The engine's body is complete: this is the last piece, and it carries
                # the end of the response (one write instead of two).
                out += framer.finish()
            if out or last:
                await self._forward(ex, meter, out, not last)
                if received:
                    relay = time.perf_counter() - received
                    self.core.metrics.overhead.observe(plan.sent_at - plan.started + relay)
                    received = 0.0
                    if plan.clock is not None:
                        self.core.metrics.stages.observe(plan.clock)
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
            last = response.finished

    async def _forward(self, ex: Exchange, meter: StreamMeter, chunk: bytes, more: bool) -> None:
        plan = ex.plan
        first = meter.feed(chunk) and plan.life.awaiting_first_token
        await ex.send({"type": "http.response.body", "body": chunk, "more_body": more})
        clock = plan.clock
        if clock is not None and not clock.relayed:
            clock.relayed = time.perf_counter()
        if first:  # accounted once the token is on its way to the client
            plan.first_token()

    def _mid_stream_failure(self, plan: Plan, error: Exception) -> tuple[int, bool]:
        """Count a stream that broke after its first event; the status for its error event.
        Past the deadline is no fault of the engine's: no breaker strike."""
        core = self.core
        kind = (
            "response_deadline"
            if isinstance(error, ResponseDeadline)
            else error.limit
            if isinstance(error, MalformedStream)
            else "mid_stream"
        )
        core.metrics.child(core.metrics.upstream_errors, plan.instance, kind).inc()
        if kind in LIMIT_KINDS:
            core.metrics.limit_hit(kind)
        if kind != "response_deadline":
            core.health.record_failure(plan.instance, time.monotonic(), kind)
        log.info("request %s: stream from %s broke: %r", plan.request_id, plan.instance, error)
        plan.fail(kind, first_byte=True)  # bytes went out: never retried
        return (504 if kind == "response_deadline" else 502), False

    def _route_headers(self, ex: Exchange) -> list[tuple[bytes, bytes]]:
        plan, detail = ex.plan, ex.detail
        headers = [(b"x-switchyard-request-id", plan.request_id.encode())]
        if detail >= Detail.ROUTE:
            headers += [
                (b"x-switchyard-instance", plan.instance.encode()),
                (b"x-switchyard-policy", plan.arm.policy_kind.encode()),
                (b"x-switchyard-arm", plan.arm.name.encode()),
                (b"x-switchyard-reason", plan.reason.encode()),
            ]
        if detail >= Detail.DEBUG:
            scores = json.dumps(plan.decision.score_table(), separators=(",", ":"))
            headers.append((b"x-switchyard-scores", scores.encode()))
            headers.append(
                (b"x-switchyard-cached-tokens", str(plan.decision.cached_tokens).encode())
            )
        return headers


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


# What a client without the debug right is told of a failed attempt whose own text comes
# from the socket layer (it quotes the engine's address, e.g. "Connect call failed
# ('10.0.0.7', 8000)").
SOCKET_FAILURE_TEXT = {
    "connect": "could not connect to the engine",
    "transport": "the connection to the engine failed",
}


def _failure_text(failure: UpstreamFailure, detail: Detail) -> str:
    if detail >= Detail.DEBUG:
        return failure.message
    return SOCKET_FAILURE_TEXT.get(failure.kind, failure.message)


def _mid_stream_message(plan: Plan, error: Exception, detail: Detail) -> str:
    """The error event's text; it names the instance only to a debug client (the route
    headers, which name it too, may be withheld from this client)."""
    engine = f"The engine {plan.instance}" if detail >= Detail.DEBUG else "The engine"
    if isinstance(error, ResponseDeadline | MalformedStream):
        return f"{engine}'s stream was cut: {error}"
    return f"{engine} failed mid-stream: {type(error).__name__}"


def _json_object_shaped(data: bytes) -> bool:
    """Starts with ``{`` and ends with ``}`` (whitespace aside): tells an HTML page or noise
    from a JSON answer without parsing (or copying) a body of up to max_response_bytes."""
    return data[:64].lstrip()[:1] == b"{" and data[-64:].rstrip()[-1:] == b"}"


def _out_of_resources(error: Exception) -> UpstreamFailure:
    return UpstreamFailure(
        "fd_exhausted",
        f"The router is out of file descriptors or local ports; retry later ({error}).",
        final=True,
        status=503,
    )


def _past_deadline(error: Exception) -> UpstreamFailure:
    return UpstreamFailure(
        "response_deadline", f"The engine's answer took too long: {error}.", final=True, status=504
    )


def _unexpected_media_type(response: Upstream, stream: bool) -> str | None:
    """The answer's media type unless it is the one due: ``text/event-stream`` for a
    stream's 200, ``application/json`` otherwise."""
    expected = (
        b"text/event-stream" if stream and response.status_code == 200 else b"application/json"
    )
    media = response.header(b"content-type", b"").split(b";", 1)[0].strip().lower()
    return None if media == expected else media.decode("latin-1")


async def _bad_response(
    response: Upstream,
    what: str,
    data: bytes | None = None,
) -> UpstreamFailure:
    """An answer not in the shape due (an HTML page from a proxy in between, noise) is
    never relayed. A success so shaped means a broken instance: retried elsewhere and held
    against it. An error status so shaped (a proxy's 413 page, say) is more likely about
    the request, which every instance would answer alike: the client gets that status
    with an OpenAI-style body, and no breaker counts it (as with suspected requests)."""
    status = response.status_code
    if status < 400:
        return UpstreamFailure("bad_response", f"the engine answered HTTP {status} with {what}")
    detail = (
        data[:200].decode("utf-8", "replace") if data is not None else await _safe_read(response)
    )
    return UpstreamFailure(
        "bad_response",
        f"The engine answered HTTP {status} with {what}: {detail}",
        final=True,
        status=status,
    )


def _upstream_target(runtime: Runtime, instance: str, path: str) -> Target:
    """Parsed URL, request head and timeouts, cached on the runtime."""
    cache = runtime.upstream_cache
    key = (instance, path)
    found = cache.get(key)
    if found is None:
        settings = runtime.config.router
        found = cache[key] = make_target(
            runtime.urls[instance] + path,
            FIXED_UPSTREAM_HEADERS,
            settings.connect_timeout_s,
            settings.first_byte_timeout_s,
            settings.response_deadline_s,
        )
    return found


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


def _upstream_headers(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    """The client's headers passed on to the engine (the fixed ones are in the Target)."""
    out = []
    for name in FORWARDED_HEADERS:
        value = headers.get(name)
        if value is not None:
            out.append((name.encode(), value.encode("latin-1")))
    return out


async def _safe_read(response: Upstream) -> str:
    try:
        return (await response.read())[:200].decode("utf-8", "replace")
    except httpx.HTTPError:
        return ""


async def send_json(
    send: Send, status: int, payload: Any, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    data = json.dumps(payload).encode()
    headers = [JSON_TYPE, (b"content-length", str(len(data)).encode()), *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def send_error(send: Send, error: APIError) -> None:
    data = error_bytes(error.status, error.message, error.param)
    headers = [JSON_TYPE, (b"content-length", str(len(data)).encode())]
    if error.status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="switchyard"'))
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
