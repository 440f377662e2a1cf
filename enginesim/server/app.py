"""The ASGI app of one instance: vLLM's OpenAI-compatible surface plus /admin."""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from engine_interface.agent_apis import responses_turns
from engine_interface.openai_errors import ErrorShape
from enginesim.engine.core import EngineRequestError
from enginesim.engine.fleet import instance_hardware
from enginesim.server import disagg, openai_api, tokenizer
from enginesim.server.agent_api import MessagesRenderer, ResponsesRenderer, ResponseStore
from enginesim.server.chat import ChatTemplate
from enginesim.server.driver import RequestStream
from enginesim.server.faults import FaultError, FaultRequest
from enginesim.server.instance import Instance
from enginesim.server.openai_api import APIError, ChunkRenderer, GenerationRequest
from enginesim.server.request_log import RequestTiming
from enginesim.server.responses import PendingJSONResponse, SSEResponse

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
Parser = Callable[[Any, str, int], GenerationRequest]
BIG_BODY_BYTES = 64 * 1024
Renderer = ChunkRenderer | ResponsesRenderer | MessagesRenderer
# vLLM's ids: chat (and Messages, answered from a chat completion), completions, responses.
ID_PREFIXES = {"chat": "chatcmpl-", "messages": "chatcmpl-", "completion": "cmpl-"}
ID_PREFIXES["responses"] = "resp_"


def error_response(
    status: int, message: str, param: str | None = None, shape: ErrorShape = "openai"
) -> JSONResponse:
    return JSONResponse(openai_api.error_dict(status, message, param, shape), status_code=status)


async def _json_body(request: Request) -> Any:
    try:
        return await request.json()
    except (ValueError, UnicodeDecodeError) as exc:
        raise APIError(400, f"Invalid JSON body: {exc}") from exc
    except ClientDisconnect:  # gone before its body arrived (a router gave up on a hung engine)
        raise APIError(400, "The client disconnected before sending the whole body") from None


class InstanceAPI:
    """Request handlers bound to one instance."""

    def __init__(self, instance: Instance) -> None:
        self.instance = instance
        self.bos = tokenizer.added_bos(instance.engine_config.model.key)
        self.stored = ResponseStore()
        self._kill_task: asyncio.Future[None] | None = None

    # -- generation -----------------------------------------------------------

    async def completions(self, request: Request) -> Any:
        return await self._generate(
            request, functools.partial(openai_api.parse_completion, bos=self.bos)
        )

    async def chat_completions(self, request: Request) -> Any:
        template = self.instance.chat_template
        return await self._generate(
            request, functools.partial(openai_api.parse_chat, template=template, bos=self.bos)
        )

    async def responses(self, request: Request) -> Any:
        parse = functools.partial(
            openai_api.parse_responses,
            template=self.instance.chat_template,
            bos=self.bos,
            history=self.stored.get,
        )
        return await self._generate(request, parse)

    async def messages(self, request: Request) -> Any:
        parse = functools.partial(
            openai_api.parse_messages, template=self.instance.chat_template, bos=self.bos
        )
        return await self._generate(request, parse, shape="anthropic")

    async def _generate(self, request: Request, parse: Parser, shape: ErrorShape = "openai") -> Any:
        inst = self.instance
        arrival = time.monotonic()
        try:
            body = await _json_body(request)
            if int(request.headers.get("content-length") or 0) >= BIG_BODY_BYTES:
                # Tokenizing megabytes takes seconds: in a thread, as vLLM does, so that
                # /health and the other requests' streams are still served meanwhile.
                gen = await asyncio.to_thread(parse, body, inst.served_name, inst.max_model_len)
            else:
                gen = parse(body, inst.served_name, inst.max_model_len)
            kv = disagg.parse_kv_transfer(body, inst.settings.role, gen.stream)
        except APIError as exc:
            return JSONResponse(exc.body(shape), status_code=exc.status)
        on_landed = None
        if kv is not None and kv.remote is not None:
            failure = await self._claim(kv.remote, len(gen.prompt_token_ids))
            if failure is not None:
                return failure
            on_landed = functools.partial(inst.side_channel.release, kv.remote)
        # vLLM's request id: the client's X-Request-Id when it sends one. The engine's own
        # id stays unique (clients may send one id twice), as vLLM's does.
        unique = uuid.uuid4().hex
        given = None if gen.kind == "responses" else request.headers.get("x-request-id")
        req_id = ID_PREFIXES[gen.kind] + (given or unique)
        driver = inst.driver
        engine_req_id = f"{req_id}-{unique}" if given else req_id
        try:
            answer = tokenizer.SyntheticText(gen.seed).token_id_array(0, gen.max_tokens)
            stream = driver.submit(
                engine_req_id,
                gen.prompt_token_ids,
                gen.max_tokens,
                gen.natural_stop,
                output_token_ids=answer,
                hold_kv=kv is not None and kv.hold,
                on_landed=on_landed,
            )
        except EngineRequestError as exc:
            return error_response(400, str(exc), shape=shape)
        renderer = self._renderer(gen, req_id, int(time.time()), stream.prompt_len)
        timing = RequestTiming(
            req_id,
            inst.settings.index,
            gen.stream,
            arrival,
            prompt_tokens=stream.prompt_len,
            traceparent=request.headers.get("traceparent"),
        )

        def on_disconnect() -> None:
            driver.abort(stream)
            if not gen.stream:  # a stream's record is written as its chunk generator closes
                self._log(timing, stream, completed=False)

        if gen.stream:
            chunks = self._sse_chunks(gen, stream, renderer, timing)
            return SSEResponse(chunks, inst.faults, on_disconnect)

        def render() -> dict[str, Any]:
            self._log(timing, stream, completed=True)
            answer = renderer.whole(self._outcome(gen, stream, req_id, stream.num_output_tokens))
            if kv is not None and kv.hold:  # vLLM's answer names the blocks the decode reads
                answer["kv_transfer_params"] = self._held_params(engine_req_id)
            return answer

        return PendingJSONResponse(stream.wait_finished(), render, inst.faults, on_disconnect)

    def _renderer(
        self, gen: GenerationRequest, req_id: str, created: int, prompt_tokens: int
    ) -> Renderer:
        name = self.instance.served_name
        if gen.kind == "responses":
            assert gen.body is not None
            return ResponsesRenderer(req_id, created, name, gen.body)
        if gen.kind == "messages":
            return MessagesRenderer(req_id, created, name, prompt_tokens)
        return ChunkRenderer(gen.kind, req_id, created, name)

    def _outcome(
        self, gen: GenerationRequest, stream: RequestStream, req_id: str, sent: int
    ) -> openai_api.Outcome:
        """How the request ended; a stored response becomes its chain's next history."""
        text = functools.cache(functools.partial(_answer, gen.seed, sent))
        if gen.chat_body is not None and gen.body is not None and gen.body.get("store", True):
            self.stored.put(req_id, responses_turns(gen.chat_body, text()))
        return openai_api.Outcome(
            stream.prompt_len, sent, stream.num_cached_tokens, stream.finish_reason, text
        )

    async def _sse_chunks(
        self,
        gen: GenerationRequest,
        stream: RequestStream,
        renderer: Renderer,
        timing: RequestTiming,
    ) -> AsyncIterator[bytes]:
        interval = self.instance.settings.stream_interval
        text = tokenizer.SyntheticText(gen.seed)
        completed = False
        try:
            for chunk in renderer.opening():
                yield chunk
            sent = seen = 0
            final_sent = False
            while not final_sent:
                await stream.wait_beyond(seen)
                seen = stream.num_output_tokens
                while seen - sent >= interval or (stream.finished and not final_sent):
                    count = min(interval, seen - sent)
                    final_sent = stream.finished and sent + count == seen
                    reason = stream.finish_reason if final_sent else None
                    if timing.first_token is None:
                        timing.first_token = time.monotonic()
                    yield renderer.content_chunk(
                        text.text(sent, sent + count), reason, json_safe=True
                    )
                    sent += count
            outcome = self._outcome(gen, stream, timing.request_id, sent)
            for chunk in renderer.closing(outcome, gen.include_usage):
                yield chunk
            completed = True
        finally:
            self._log(timing, stream, completed)

    # -- disaggregation ----------------------------------------------------------

    async def _claim(self, remote: disagg.RemoteBlocks, prompt_tokens: int) -> Response | None:
        """A decode call's blocks, claimed from the prefill instance before the request
        enters the engine; the 500 the client gets when they cannot be read."""
        try:
            held = await self.instance.side_channel.claim(remote)
            if held != prompt_tokens:
                raise disagg.TransferFailed(
                    f"the blocks hold {held} prompt tokens; this prompt has {prompt_tokens}"
                )
        except disagg.TransferFailed as exc:
            self.instance.metrics.failed_transfers += 1
            return error_response(500, f"KV transfer failed: {exc}")
        return None

    def _held_params(self, engine_req_id: str) -> dict[str, Any] | None:
        inst = self.instance
        block_ids = inst.engine.held_block_ids(engine_req_id)
        if block_ids is None:
            return None
        settings = inst.settings
        return disagg.answer_params(
            inst.engine_id, engine_req_id, block_ids, settings.host, settings.port
        )

    async def kv_claim(self, request: Request) -> Response:
        """The side channel: a decode instance asks to read the blocks a prefill holds."""
        inst = self.instance
        try:
            body = await _json_body(request)
            engine_id, req_id, block_ids = _side_channel_body(body)
        except APIError as exc:
            return JSONResponse(exc.body(), status_code=exc.status)
        if engine_id != inst.engine_id:
            return error_response(
                404, f"engine {engine_id} is not this instance's ({inst.engine_id}): restarted?"
            )
        inst.driver.advance()  # holds past their timeout are freed first
        held = inst.engine.held_block_ids(req_id)
        if held is None:
            return error_response(404, f"no blocks held for {req_id} (read, or timed out)")
        if held != block_ids:
            return error_response(409, f"{req_id} holds blocks {held}, not {block_ids}")
        return JSONResponse({"num_tokens": inst.engine.held_tokens(req_id)})

    async def kv_release(self, request: Request) -> Response:
        """The side channel: the decode instance has read the blocks."""
        inst = self.instance
        try:
            body = await _json_body(request)
            engine_id, req_id, _ = _side_channel_body(body)
        except APIError as exc:
            return JSONResponse(exc.body(), status_code=exc.status)
        released = engine_id == inst.engine_id and inst.engine.release_held(
            req_id, inst.driver.advance()
        )
        return JSONResponse({"released": released})

    def _log(self, timing: RequestTiming, stream: RequestStream, completed: bool) -> None:
        log = self.instance.request_log
        if log is None:
            return
        timing.finished = time.monotonic()
        timing.cached_tokens = stream.num_cached_tokens
        timing.output_tokens = stream.num_output_tokens
        timing.completed = completed
        if timing.first_token is None and not timing.stream and stream.num_output_tokens:
            timing.first_token = timing.finished  # a whole answer: its first token is its end
        log.write(timing)

    # -- other vLLM endpoints -------------------------------------------------

    async def models(self, request: Request) -> Response:
        inst = self.instance
        card = {
            "id": inst.served_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "vllm",
            "root": inst.served_name,
            "parent": None,
            "max_model_len": inst.max_model_len,
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": "enginesim"})

    async def tokenize(self, request: Request) -> Response:
        try:
            body = await _json_body(request)
            if not isinstance(body, dict):
                raise APIError(400, "request body must be a JSON object")
            text = self._tokenize_text(body, self.instance.chat_template)
            # vLLM's defaults: a prompt gets the special tokens, messages do not
            prefix = openai_api.special_prefix(body, self.bos, default="messages" not in body)
        except APIError as exc:
            return JSONResponse(exc.body(), status_code=exc.status)
        tokens = tokenizer.encode(prefix) + tokenizer.encode(text)
        strs = None
        if body.get("return_token_strs"):
            strs = tokenizer.split_pieces(prefix) + tokenizer.split_pieces(text)
        return JSONResponse(
            {
                "count": len(tokens),
                "max_model_len": self.instance.max_model_len,
                "tokens": tokens,
                "token_strs": strs,
            }
        )

    @staticmethod
    def _tokenize_text(body: dict[str, Any], template: ChatTemplate) -> str:
        if "messages" in body:
            return openai_api.render_chat_request(body, template)
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise APIError(400, "prompt (a string) or messages is required", "prompt")
        return prompt

    async def detokenize(self, request: Request) -> Response:
        try:
            body = await _json_body(request)
        except APIError as exc:
            return JSONResponse(exc.body(), status_code=exc.status)
        tokens = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            return error_response(400, "tokens must be a list of integers", "tokens")
        return JSONResponse({"prompt": tokenizer.decode(tokens)})

    async def metrics(self, request: Request) -> Response:
        return Response(self.instance.metrics.render(), media_type=PROMETHEUS_CONTENT_TYPE)

    async def reset_prefix_cache(self, request: Request) -> Response:
        if not self.instance.engine.reset_prefix_cache():
            return error_response(400, "prefix cache is in use; reset refused")
        return Response(status_code=200)

    # -- admin ------------------------------------------------------------------

    async def get_fault(self, request: Request) -> Response:
        return JSONResponse(self.instance.faults.as_json())

    async def hardware(self, request: Request) -> Response:
        """What this instance simulates: its GPU, speed, jitter, KV capacity, batch budgets
        and cost coefficients (fleet variation makes them differ between instances)."""
        return JSONResponse(
            {
                "instance": self.instance.settings.index,
                "role": self.instance.settings.role,
                "kv_link": self.instance.engine_config.kv_link.key,
                **instance_hardware(self.instance.engine_config),
            }
        )

    async def post_fault(self, request: Request) -> Response:
        try:
            fault = FaultRequest.from_json(await request.json())
        except (FaultError, ValueError) as exc:
            return error_response(400, str(exc))
        if fault.mode == "kill":
            # Answer before the port closes; the kill proceeds in the background.
            self._kill_task = asyncio.ensure_future(self.instance.apply_fault(fault))
            return JSONResponse({**self.instance.faults.as_json(), "mode": "kill"})
        await self.instance.apply_fault(fault)
        return JSONResponse(self.instance.faults.as_json())


def _answer(seed: int, tokens: int) -> str:
    return tokenizer.SyntheticText(seed).text(0, tokens)


def _side_channel_body(body: Any) -> tuple[str, str, list[int]]:
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object")
    engine_id, req_id, block_ids = (
        body.get("engine_id"),
        body.get("request_id"),
        body.get("block_ids"),
    )
    if not isinstance(engine_id, str):
        raise APIError(400, "engine_id must be a string", "engine_id")
    if not isinstance(req_id, str):
        raise APIError(400, "request_id must be a string", "request_id")
    if not isinstance(block_ids, list) or not all(isinstance(b, int) for b in block_ids):
        raise APIError(400, "block_ids must be a list of integers", "block_ids")
    return engine_id, req_id, block_ids


class FaultGate:
    """ASGI wrapper applying hang / error5xx / poison / wrong_content_type to every non-admin
    request."""

    def __init__(self, app: Any, instance: Instance) -> None:
        self.app = app
        self.instance = instance

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        faults = self.instance.faults
        if scope["type"] == "http" and not scope["path"].startswith("/admin/"):
            await faults.wait_not_hung()
            if faults.failing:
                await _send_500(send, "Injected fault: error5xx")
                return
            if faults.mode == "wrong_content_type" and scope["path"].startswith("/v1/"):
                await _read_body(receive)
                await _send_html(send)
                return
            if faults.mode == "poison" and scope["path"].startswith("/v1/"):
                body = await _read_body(receive)
                if faults.poisoned_by(body):
                    await _send_500(
                        send, "Injected fault: poison (the engine failed on this request)"
                    )
                    return
                receive = _replay(body, receive)
        await self.app(scope, receive, send)


async def _read_body(receive: Any) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if message["type"] != "http.request" or not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Any) -> Any:
    """A ``receive`` that gives the already-read body once, then the real channel."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> dict[str, Any]:
        return pending.pop() if pending else await receive()

    return replayed


async def _send_html(send: Any) -> None:
    body = b"<html><body><h1>Welcome</h1><p>Injected fault: wrong_content_type</p></body></html>"
    headers = [
        (b"content-type", b"text/html; charset=utf-8"),
        (b"content-length", str(len(body)).encode()),
    ]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _send_500(send: Any, message: str) -> None:
    body = openai_api.dumps(openai_api.error_dict(500, message)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 500, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def build_app(instance: Instance) -> Any:
    """The ASGI app serving one instance."""
    api = InstanceAPI(instance)
    routes = [
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/chat/completions", api.chat_completions, methods=["POST"]),
        Route("/v1/responses", api.responses, methods=["POST"]),
        Route("/v1/messages", api.messages, methods=["POST"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/health", api.health, methods=["GET"]),
        Route("/version", api.version, methods=["GET"]),
        Route("/tokenize", api.tokenize, methods=["POST"]),
        Route("/detokenize", api.detokenize, methods=["POST"]),
        Route("/metrics", api.metrics, methods=["GET"]),
        Route("/reset_prefix_cache", api.reset_prefix_cache, methods=["POST"]),
        Route(disagg.CLAIM_PATH, api.kv_claim, methods=["POST"]),
        Route(disagg.RELEASE_PATH, api.kv_release, methods=["POST"]),
        Route("/admin/fault", api.get_fault, methods=["GET"]),
        Route("/admin/hardware", api.hardware, methods=["GET"]),
        Route("/admin/fault", api.post_fault, methods=["POST"]),
    ]
    return FaultGate(Starlette(routes=routes), instance)
