"""A routed request sent to its engine, attempt after attempt, until one is answered.

Failure handling: a connect error, a timeout, a 5xx or a dropped connection *before the
first body byte* is retried where the arm's policy, asked again without the instances
that failed, sends it (the retry rule of ``routing.lifecycle``: ``plan.attempt_failed``),
up to ``max_attempts``; the client sees nothing of it (the response starts only with the
first upstream byte). Once the rule gives up, the client gets one error in the OpenAI
shape. What a failure costs its instance (the circuit breaker) and how it is counted are
the plan's observers' (:mod:`router_worker.observers`).

Resource limits (README "Resource limits"): an answer of the wrong content type or not
shaped like JSON / SSE (``sse.SseFramer``) is a failure like a 5xx (retried before the
first byte, an SSE error event after it); an answer past ``response_deadline_s`` or over
``max_response_bytes``, and a connect that failed for want of the router's own file
descriptors, are ``final``: not retried, not held against the instance.

Migration (policies that set ``migrates``): a streamed attempt runs as its plan's own task
until its first byte (``Plan.run_movable``); when the policy moves it, the plan takes it
back and this step sends the request to the target as the next attempt.

Disaggregation (a split plan, :mod:`router_worker.disagg`): the prefill call goes first,
attempt after attempt on the prefill pool under the same retry rule; its answer (never the
client's) opens the decode attempt, whose answer is relayed as above. If no prefill
instance serves it, or the decode stage gives up before the first byte (the read failed,
the decode instance failed), the request falls back once to a colocated attempt with the
client's own body. A prefill's 4xx is the client's answer.
"""

from __future__ import annotations

import time
from dataclasses import replace
from functools import partial
from typing import Any

import httpx

from router_worker.continuation import streamed_upstream
from router_worker.disagg import answered_params, decode_body, prefill_body
from router_worker.errors import APIError, send_error, sse_error_event
from router_worker.failures import (
    UpstreamFailure,
    bad_response,
    failure_text,
    out_of_resources,
    past_deadline,
    safe_read,
    transport_failure,
    unexpected_media_type,
)
from router_worker.intake import take_in
from router_worker.plan import Plan, TakenBack
from router_worker.relay import Exchange, relay_stream, relay_whole, send_assembled
from router_worker.routing import NoEligibleInstanceError
from router_worker.runtime import Runtime
from router_worker.sse import DONE_EVENT
from router_worker.upstream import (
    FastTransport,
    LocalExhaustion,
    ResponseDeadline,
    ResponseTooLarge,
    Target,
    Upstream,
    make_target,
)

FIXED_UPSTREAM_HEADERS = ((b"content-type", b"application/json"), (b"accept-encoding", b"identity"))


class Dispatcher:
    """Sends exchanges over the router's shared upstream transport."""

    def __init__(self, transport: FastTransport) -> None:
        self.transport = transport

    async def run(self, ex: Exchange) -> None:
        """Send the plan's attempts until one is answered or the retry rule gives up."""
        plan = ex.plan
        _assemble(ex)
        colocated = ex.raw
        if plan.stage == "prefill":
            try:
                answered = await self._split(ex)
            except BaseException:
                plan.client_gone()
                raise
            if answered:
                return
        while True:
            try:
                failure = await self._movable_attempt(ex)
            except TakenBack:
                plan.migrated()
                continue
            except BaseException:
                plan.client_gone()  # the client went away (or a bug): the attempt ends
                raise
            if failure is None:
                return
            if ex.splice is not None:  # the client has bytes of the answer
                if await self._broken(ex, failure):
                    continue
                return
            verdict = plan.attempt_failed(failure.kind, final=failure.final, detail=failure.message)
            if not verdict.retry:
                if plan.stage == "decode" and verdict.why != "first_byte":
                    ex.raw = colocated
                    if _fell_back(plan):
                        continue
                break
        await self._give_up(ex, failure)

    async def _split(self, ex: Exchange) -> bool:
        """The prefill stage: prefill attempts until one answers with its
        ``kv_transfer_params`` (the decode attempt is then routed and the body rewritten)
        or the retry rule gives up (the request falls back to colocated). True when the
        client was answered here (a prefill's 4xx, or no instance left at all)."""
        plan = ex.plan
        body = prefill_body(ex.raw)
        while True:
            outcome = await self._prefill_attempt(ex, body)
            if isinstance(outcome, dict):
                try:
                    plan.prefilled()
                except NoEligibleInstanceError:
                    break
                ex.raw = decode_body(ex.raw, outcome)
                return False
            if outcome is None:
                return True
            verdict = plan.attempt_failed(outcome.kind, final=outcome.final, detail=outcome.message)
            if not verdict.retry:
                break
        if _fell_back(plan):
            return False
        await self._give_up(ex, UpstreamFailure("no_instance", "no instance left to serve it"))
        return True

    async def _prefill_attempt(
        self, ex: Exchange, body: bytes
    ) -> dict[str, Any] | UpstreamFailure | None:
        """One prefill call: its ``kv_transfer_params``, its failure, or None when its
        answer (a 4xx) was relayed to the client."""
        plan = ex.plan
        target = _upstream_target(plan.runtime, plan.instance, ex.path)
        plan.sent_at = time.perf_counter()
        sent = await self._post(ex, target, body, None)
        if isinstance(sent, UpstreamFailure):
            return sent
        response = sent
        try:
            if response.status_code >= 500:
                text = await safe_read(response)
                return UpstreamFailure("http_5xx", f"HTTP {response.status_code}: {text}")
            if response.status_code >= 400:
                await relay_whole(ex, response)
                return None
            try:
                data = await response.read()
            except httpx.TransportError as error:  # timeouts and size limits included
                return transport_failure(error)
            params = answered_params(data)
            if params is None:
                return await bad_response(response, "a prefill answer without kv_transfer_params")
            return params
        finally:
            await response.aclose()

    async def _post(
        self, ex: Exchange, target: Target, body: bytes, clock: Any
    ) -> Any | UpstreamFailure:
        """POST ``body``; the response (head read) or the failure."""
        try:
            return await self.transport.post(target, ex.headers, body, partial(_sent, ex), clock)
        except LocalExhaustion as error:
            return out_of_resources(error)
        except httpx.ConnectError as error:
            return UpstreamFailure("connect", str(error) or "connection refused")
        except ResponseDeadline as error:
            return past_deadline(error)
        except httpx.TimeoutException as error:
            return UpstreamFailure("timeout", f"no answer in time ({type(error).__name__})")
        except ResponseTooLarge as error:
            return UpstreamFailure(error.limit, str(error))
        except httpx.TransportError as error:
            return transport_failure(error)

    async def _broken(self, ex: Exchange, failure: UpstreamFailure) -> bool:
        """The answer broke after the client had bytes of it: True if it is to be
        continued (the lifecycle's continuation rule), else it ends here: with ``[DONE]``
        if all of it was sent after all, else with an SSE error event that says why it
        was not continued."""
        plan, splice = ex.plan, ex.splice
        assert splice is not None
        if plan.max_continuations and not failure.final and not ex.continuable:
            plan.not_continuable = "only chat and completions answers are continued"
        elif plan.max_continuations and not failure.final:
            why, answer = splice.prepare(ex.raw, ex.chat)
            if answer.finished:  # only the end of the stream was lost
                ex.watch.done = True
                if ex.assembled:
                    await send_assembled(ex)
                else:
                    await ex.send({"type": "http.response.body", "body": DONE_EVENT})
                ex.end_stream(status=200, ok=True)
                return False
            plan.not_continuable = why
            if not why:
                _route_as_resent(ex)
        detail = failure.detail or failure.message
        verdict = plan.attempt_failed(
            failure.kind, first_byte=True, final=failure.final, detail=detail
        )
        if verdict.retry:
            return True
        message = failure.message if failure.streamed else failure_text(failure, ex.detail)
        message += _not_continued(plan)
        ex.watch.done = True
        if ex.assembled:  # the client has nothing yet: an error answer, as for a whole one
            await send_error(ex.send, APIError(failure.status, message), ex.shape)
            ex.end_stream(status=failure.status, ok=False)
            return False
        await ex.send(
            {
                "type": "http.response.body",
                "more_body": False,
                "body": sse_error_event(failure.status, message, ex.shape),
            }
        )
        ex.end_stream(status=failure.status, ok=False)
        return False

    async def _give_up(self, ex: Exchange, failure: UpstreamFailure) -> None:
        """The retry rule gave up: the client gets the last failure, in its API's shape."""
        plan = ex.plan
        last = failure_text(failure, ex.detail)
        verdict = plan.verdict
        status = 504 if failure.kind == "timeout" else 502
        if failure.final:
            status, message = failure.status, last
        elif verdict is not None and verdict.why == "poison":
            message = (
                f"The request failed on {len(plan.answered_5xx)} instances alike and was "
                f"not retried further; last: {last}"
            )
        else:
            message = f"All {plan.attempt_count} attempts failed; last: {last}"
        plan.done(status=status, ok=False, output_tokens=0, last_token_at=None, cached_tokens=0)
        await send_error(ex.send, APIError(status, message), ex.shape)

    async def _movable_attempt(self, ex: Exchange) -> UpstreamFailure | None:
        """The attempt; for a migrating policy's streamed request, run as the plan's own
        task, which the plan may take back until the first byte (``TakenBack``)."""
        if ex.stream and ex.plan.arm.policy.migrates:
            return await ex.plan.run_movable(self._attempt(ex))
        return await self._attempt(ex)

    async def _attempt(self, ex: Exchange) -> UpstreamFailure | None:
        plan = ex.plan
        target = _upstream_target(plan.runtime, plan.instance, ex.path)
        plan.sent_at = time.perf_counter()
        splice = ex.splice
        payload = ex.raw if splice is None or splice.body is None else splice.body
        # Straight to the shared transport, without httpx.Request/Response objects: the
        # client's layers and httpx's models cost more CPU than the exchange.
        sent = await self._post(ex, target, payload, plan.clock)
        if isinstance(sent, UpstreamFailure):
            return sent
        response = sent
        try:
            if response.status_code >= 500:
                body = await safe_read(response)
                return UpstreamFailure("http_5xx", f"HTTP {response.status_code}: {body}")
            if splice is not None and response.status_code != 200:
                return await _refused_continuation(response)
            media = unexpected_media_type(response, ex.stream)
            # Asked for a stream to assemble, an engine may answer whole all the same: the
            # client asked for that (never for a continuation: it joins what was kept).
            whole = ex.assembled and splice is None and media == "application/json"
            if media is not None and not whole:
                return await bad_response(response, f"content type {media!r}")
            if ex.stream and response.status_code == 200 and not whole:
                return await relay_stream(ex, response)
            return await relay_whole(ex, response)
        finally:
            await response.aclose()


def _assemble(ex: Exchange) -> None:
    """A non-streamed chat or completions request that could be continued goes upstream as
    a stream, assembled into one body for the client (``Exchange.assembled``), so that an
    engine dying mid-generation costs a continuation, not the whole answer again. Left as
    they are: continuations off, disaggregated plans (their stages have their own bodies),
    and bodies big enough to be taken in off the event loop (reading them again here
    would stall it: they are retried whole, as before)."""
    plan = ex.plan
    if ex.stream or not ex.continuable or not plan.max_continuations or plan.split is not None:
        return
    if len(ex.raw) >= plan.runtime.config.router.offload_body_bytes:
        return
    body = streamed_upstream(ex.raw, ex.chat)
    if body is not None:
        ex.raw, ex.stream, ex.assembled = body, True, True
        ex.prompt_tokens = plan.features.prompt_tokens


def _fell_back(plan: Plan) -> bool:
    """The split request runs colocated from here (False: no instance for it)."""
    try:
        plan.fall_back()
    except NoEligibleInstanceError:
        return False
    return True


def _route_as_resent(ex: Exchange) -> None:
    """The continuation is routed like any prompt: on the tokens and blocks of what it
    re-sends (the prompt and the text already sent), whose cache may be elsewhere. A body
    too big to take in on the event loop keeps the first prompt's."""
    plan, splice, runtime = ex.plan, ex.splice, ex.plan.runtime
    assert splice is not None and splice.body is not None
    if len(splice.body) >= runtime.config.router.offload_body_bytes:
        return
    try:
        intake = take_in(
            splice.body,
            "chat" if ex.chat else "completions",
            runtime.tokenizer,
            runtime.config.block_size,
        )
    except APIError:  # the router's own rendering refused it: route as the first prompt
        return
    plan.features = replace(
        plan.features, prompt_tokens=intake.prompt_tokens, block_hashes=intake.block_hashes
    )


async def _refused_continuation(response: Upstream) -> UpstreamFailure:
    """A continuation answered with an error status (the engine took the re-sent text
    for a bad request, over its context say): another instance would refuse it alike
    (``final``: no strike, no further continuation)."""
    body = await safe_read(response)
    return UpstreamFailure(
        "continuation_refused",
        f"The continuation was refused: HTTP {response.status_code}: {body}",
        final=True,
    )


def _not_continued(plan: Plan) -> str:
    """Why a broken answer was not continued, for its error event ('' if continuations
    are off, or the failure was not the engine's)."""
    verdict = plan.verdict
    why = "" if verdict is None else verdict.why
    if why == "not_continuable":
        return f"; not continued: {plan.not_continuable}"
    if why == "continuations_exhausted":
        return f"; not continued: {plan.continuations} continuations made (the limit)"
    if why == "no_instance":
        return "; not continued: no other instance available"
    return ""


def _sent(ex: Exchange) -> None:
    """The attempt is on its way upstream: its accounting, and from now on a client
    disconnect cancels it (until then nothing waited that it could interrupt)."""
    ex.plan.sent()
    ex.watch.start()


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
