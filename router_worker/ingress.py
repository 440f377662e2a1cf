"""The OpenAI-compatible entry points as raw ASGI: admit, read, take in, route, dispatch.

Raw ASGI rather than a framework because this is the hot path: no per-request objects
beyond the ones we need. One request's way through the router::

    ingress (this module)   key, size and concurrency admission; body; intake (tokens,
                            hashes); core.plan (the routed Plan)
    dispatch                the plan's attempts at engines, retries (router_worker.dispatch)
    relay                   the engine's answer to the client (router_worker.relay)

Each step drives the plan; the plan's observers do the rest (metrics, breaker, telemetry,
capture). A client disconnect cancels the handler at once, which closes the upstream
connection (the engine aborts the request).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from router_worker import tracing
from router_worker.access import Detail, client_key, client_rights, detail_for, tenant_of
from router_worker.connections import ARRIVED, DISCONNECT, ClientGone, DisconnectWatch, Receive
from router_worker.core import RouterCore
from router_worker.dispatch import Dispatcher
from router_worker.errors import APIError, ErrorShape, Send, send_error, send_json
from router_worker.flow_gate import HEADERS as FLOW_HEADERS
from router_worker.flow_gate import RequestClass
from router_worker.intake import Endpoint, Intake, IntakeRunner
from router_worker.limits import Limiter
from router_worker.plan import Plan
from router_worker.relay import Exchange
from router_worker.routing.sessions import HARNESS_HEADERS
from router_worker.runtime import Runtime
from router_worker.stages import StageClock
from router_worker.upstream import FastTransport

log = logging.getLogger("router_worker.ingress")

Scope = dict[str, Any]
__all__ = ["ENDPOINTS", "Ingress", "Receive", "Scope", "Send"]

ENDPOINTS: dict[str, Endpoint] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/responses": "responses",
    "/v1/messages": "messages",
}
# Each endpoint's errors in its API's shape (vLLM answers Anthropic's on /v1/messages).
ERROR_SHAPES: dict[Endpoint, ErrorShape] = {"messages": "anthropic"}
FORWARDED_HEADERS = ("authorization", "x-request-id", "traceparent")
DEBUG_HEADER = "x-switchyard-debug"
USED_HEADERS = frozenset(
    name.encode()
    for name in (
        "content-length",
        "x-session-id",
        *HARNESS_HEADERS,
        DEBUG_HEADER,
        *FORWARDED_HEADERS,
        *FLOW_HEADERS,
    )
)


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


class Ingress:
    """The router's OpenAI-compatible endpoints (``/v1/models`` and the two generate
    endpoints) over one :class:`RouterCore`."""

    def __init__(
        self,
        core: RouterCore,
        transport: FastTransport,
        limiter: Limiter,
        intake: IntakeRunner,
    ) -> None:
        self.core = core
        self.dispatcher = Dispatcher(transport)
        self.limiter = limiter
        self.intake = intake

    # ----- entry points -----------------------------------------------------------------
    async def models(self, scope: Scope, send: Send) -> None:
        runtime = self.core.runtime
        if runtime is not None:
            try:
                client_rights(runtime, _header(scope, b"authorization"))
            except APIError as error:
                self.core.refused(error.status)
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
        shape = ERROR_SHAPES.get(endpoint, "openai")
        # Only the headers the router reads (names arrive lower-cased from the server).
        headers = {
            k.decode("latin-1"): v.decode("latin-1")
            for k, v in scope["headers"]
            if k in USED_HEADERS
        }
        try:
            runtime = self.core.runtime
            if runtime is None:
                raise APIError(503, "The router has no configuration yet.")
            # Before the body is read: an unauthenticated client costs no more than this.
            key = client_key(runtime, headers.get("authorization"))
            rights = None if key is None else runtime.client_keys[key]
            if rights is not None:  # the router's own key is not passed on to the engines
                del headers["authorization"]
            detail = detail_for(runtime, rights, DEBUG_HEADER in headers)
            request_class = self.core.flow.classify(tenant_of(runtime, key), headers)
            check_declared(headers.get("content-length"), runtime.config.router.max_body_bytes)
            await self.limiter.acquire()
        except APIError as error:
            self.core.refused(error.status)
            await send_error(send, error, shape)
            return
        try:
            await self._admitted(
                scope, receive, send, endpoint, runtime, headers, started, detail, request_class
            )
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
        request_class: RequestClass,
    ) -> None:
        """Body, intake, flow control, then routing; from the body's end a disconnect
        watcher cancels us at once (a body waiting for an intake worker, or a request
        waiting at flow control, is dropped unread)."""
        task = asyncio.current_task()
        assert task is not None
        extensions = scope.get("extensions", {})
        watch = DisconnectWatch(receive, task, extensions.get(DISCONNECT))
        core = self.core
        core.holding(+1)
        plan: Plan | None = None
        clock = StageClock(extensions.get(ARRIVED, started))
        if tracing.TRACER is not None:
            clock.admitted = time.perf_counter()
        try:
            raw = await read_body(receive, runtime.config.router.max_body_bytes)
            clock.body = time.perf_counter()
            watch.start()
            intake = await self._take_in(raw, endpoint, runtime)
            clock.intake = time.perf_counter()
            core.check_model(intake)
            admission = await core.flow.admit(request_class, intake.prompt_tokens, len(raw))
            if tracing.TRACER is not None:
                clock.released = time.perf_counter()
            flow_tokens = intake.prompt_tokens if admission.released else 0
            try:
                plan = core.plan(runtime, intake, headers, started, request_class, flow_tokens)
            except BaseException:
                core.flow.landed(flow_tokens)
                core.flow.refund(admission.charge)
                raise
            plan.quota_charge = admission.charge
            plan.clock = clock
            clock.decided = time.perf_counter()
            up = _upstream_headers(headers)
            if tracing.TRACER is not None:
                up = traced(tracing.TRACER, plan, headers, up)
            shape = ERROR_SHAPES.get(endpoint, "openai")
            on_head = core.chain_learner(plan, intake) if endpoint == "responses" else None
            await self.dispatcher.run(
                Exchange(
                    plan,
                    scope["path"],
                    raw,
                    intake.stream,
                    up,
                    send,
                    watch,
                    detail,
                    shape,
                    on_head,
                    chat=endpoint == "chat",
                    continuable=endpoint in ("chat", "completions"),
                )
            )
        except ClientGone:
            core.left_unread()
        except APIError as error:
            if plan is None:
                core.refused(error.status)
            await send_error(send, error, ERROR_SHAPES.get(endpoint, "openai"))
        except asyncio.CancelledError:
            if not watch.gone:
                raise
            task.uncancel()
            if plan is not None:  # 499: nginx's code for "client closed the request"
                plan.done(
                    status=499, ok=False, output_tokens=0, last_token_at=None, cached_tokens=None
                )
        finally:
            watch.stop()
            core.holding(-1)

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


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


def traced(
    tracer: tracing.RequestTracer,
    plan: Plan,
    headers: dict[str, str],
    upstream: list[tuple[bytes, bytes]],
) -> list[tuple[bytes, bytes]]:
    """Start the request's span; the engine gets its trace context instead of the client's."""
    assert plan.clock is not None
    plan.span = tracer.start(headers, plan.clock.started)
    context = tracer.traceparent(plan.span)
    kept = [(name, value) for name, value in upstream if name != b"traceparent"]
    return kept if context is None else [*kept, (b"traceparent", context.encode())]


def _upstream_headers(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    """The client's headers passed on to the engine (the fixed ones are in the Target)."""
    out = []
    for name in FORWARDED_HEADERS:
        value = headers.get(name)
        if value is not None:
            out.append((name.encode(), value.encode("latin-1")))
    return out
