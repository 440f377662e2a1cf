"""Request intake: raw body → checked fields → token ids → block hashes, as one pure step.

The router forwards the client's bytes unchanged; it parses them only to learn what it
routes on. :func:`take_in` does all of that CPU work (JSON parsing, field checks,
tokenization, block hashing) as a pure function of the body and the tokenizer settings,
so that it can leave the event loop: bodies of at least ``router.offload_body_bytes``
(64 KiB by default) are taken in by a worker process (:class:`IntakeRunner`), and the
streams the loop is relaying keep flowing while an 8 MiB prompt is tokenized. A thread
would not do: JSON parsing and the token-list checks hold the GIL for their whole run
(hundreds of milliseconds for 8 MiB; bench/intake_stall/README.md has the figures).
Small bodies are taken in inline, where a process hop would cost more than the work.

Bad input gets an OpenAI-style 400 that names the field (:class:`APIError`), never an
exception escaping to the server: strict JSON (RFC 8259: no ``NaN``/``Infinity``, no
number that overflows to infinity, no lone surrogate, valid UTF-8), at most
``MAX_JSON_DEPTH`` levels of nesting, and strict types for every field the router reads
(``model``, ``prompt``, ``stream``, ``max_tokens``, ``max_completion_tokens``, ``n``,
``user``, ``add_special_tokens``; the last defaults as in vLLM: true for completions, false
for chat). Chat ``messages`` and the template options are judged by the chat-template
renderer the engine uses too (:mod:`chat_templates`), so a body the engine would refuse gets
the engine's own 400 here. Token ids must lie in ``[0, 2**64)``: the
router hashes them as uint64; the engine refuses ids beyond its vocabulary itself (vLLM:
400 "Token id … is out of vocabulary"). Everything else is the engine's to judge.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import multiprocessing
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from functools import partial
from typing import Annotated, Any, Literal, NotRequired, Required

import pydantic_core
from pydantic import Field, StrictBool, StrictInt, StrictStr, TypeAdapter, ValidationError
from typing_extensions import TypedDict  # pydantic needs it on Python < 3.12

from engine_interface.agent_apis import messages_chat_body, messages_user, responses_chat_body
from router_worker.contract.config import RouterSettings
from router_worker.errors import APIError
from router_worker.metrics import RouterMetrics
from router_worker.routing.features import hash_blocks
from router_worker.routing.sessions import compact_key
from router_worker.tokenization import PromptError, Tokenizer

log = logging.getLogger("router_worker.intake")

Endpoint = Literal["chat", "completions", "responses", "messages"]
# pydantic-core's JSON parser refuses nesting deeper than this; no OpenAI request body
# comes near it (a JSON schema in `tools` or `response_format` is a few dozen deep).
MAX_JSON_DEPTH = 200
# vLLM's defaults: a completions prompt gets the tokenizer's special tokens (Llama 3's BOS);
# a chat prompt does not, its template writes them.
# Responses and Messages are rendered as chat (engine_interface.agent_apis).
ADD_SPECIAL_TOKENS: dict[Endpoint, bool] = {
    "chat": False,
    "completions": True,
    "responses": False,
    "messages": False,
}
# The body's field holding what the chat template renders, per rendered endpoint.
RENDERED_FIELD: dict[Endpoint, str] = {
    "chat": "messages",
    "responses": "input",
    "messages": "messages",
}
WORKER_NICENESS = 10
ORPHAN_CHECK_S = 0.5
PROMPT_SHAPE = (
    "`prompt` must be a string, a list of strings, a list of token ids "
    "(integers in [0, 2**64)), or a list of such lists, none of them empty."
)
TokenId = Annotated[int, Field(strict=True, ge=0, lt=2**64)]
TokenIds = Annotated[list[TokenId], Field(min_length=1, fail_fast=True)]
Prompt = Annotated[
    StrictStr
    | Annotated[list[StrictStr], Field(min_length=1, fail_fast=True)]
    | TokenIds
    | Annotated[list[TokenIds], Field(min_length=1, fail_fast=True)],
    Field(union_mode="left_to_right"),
]


class _Common(TypedDict, total=False):
    model: Required[Annotated[str, Field(strict=True, min_length=1)]]
    stream: StrictBool | None
    max_tokens: StrictInt | None
    max_completion_tokens: StrictInt | None
    n: StrictInt | None
    user: StrictStr | None
    add_special_tokens: StrictBool  # vLLM's field is a bool, not optional: null is a 400


class _ChatFields(_Common):
    # Judged by the shared chat-template renderer, as the engine judges it (same 400).
    messages: Required[Any]


class _CompletionFields(_Common):
    prompt: NotRequired[Prompt]


class _ResponsesFields(TypedDict, total=False):
    model: Required[Annotated[str, Field(strict=True, min_length=1)]]
    stream: StrictBool | None
    max_output_tokens: StrictInt | None
    user: StrictStr | None
    previous_response_id: StrictStr | None
    input: Required[Any]  # judged by engine_interface.agent_apis and the template


class _MessagesFields(TypedDict, total=False):
    model: Required[Annotated[str, Field(strict=True, min_length=1)]]
    stream: StrictBool | None
    max_tokens: Required[StrictInt]  # the Messages API requires it
    messages: Required[Any]


# Unknown keys are ignored (forwarded as they are; the engine judges them).
_FIELDS: dict[str, TypeAdapter[Any]] = {
    "chat": TypeAdapter(_ChatFields),
    "completions": TypeAdapter(_CompletionFields),
    "responses": TypeAdapter(_ResponsesFields),
    "messages": TypeAdapter(_MessagesFields),
}


@dataclass(frozen=True, slots=True)
class IntakeSettings:
    """What a worker process needs to take a body in (picklable)."""

    tokenizer_path: str | None
    chat_template: str
    block_size: int


@dataclass(frozen=True, slots=True)
class Intake:
    """What the router routes on, taken from a checked body."""

    model: str
    stream: bool
    user: str | None  # a long one replaced by its digest (routing.sessions.compact_key)
    turn_index: int | None
    previous_response_id: str | None  # responses: the chain this turn extends
    prompt_tokens: int
    block_hashes: tuple[int, ...]
    tokenization: str  # the tokenization mode: ids, exact or approx
    tokenize_s: float
    hash_s: float


def parse_json(raw: bytes) -> Any:
    """Strict JSON, or APIError 400 (see the module docstring for what is refused)."""
    try:
        body = pydantic_core.from_json(raw, allow_inf_nan=False, cache_strings=False)
    except ValueError as error:
        raise APIError(400, f"Invalid JSON body: {error}") from None
    if _holds_non_finite(body):
        raise APIError(
            400, "Invalid JSON body: a number is too large to represent (it overflows to infinity)."
        )
    return body


def _holds_non_finite(document: Any) -> bool:
    """Whether a float in ``document`` is infinite (a literal like ``1e999``; the parser
    refuses NaN and Infinity). Iterative, and C-speed over long lists of one type: a
    regular expression over the raw bytes was far slower."""
    stack = [document]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            value = list(value.values())
        elif not isinstance(value, list):
            continue
        kinds = set(map(type, value))
        if float in kinds and not all(math.isfinite(v) for v in value if type(v) is float):
            return True
        if dict in kinds or list in kinds:
            stack.extend(v for v in value if type(v) is dict or type(v) is list)
    return False


def check_fields(body: Any, endpoint: Endpoint) -> dict[str, Any]:
    """The fields the router reads, strictly typed, or APIError 400 naming the field."""
    if not isinstance(body, dict):
        raise APIError(400, "The request body must be a JSON object.")
    if "kv_transfer_params" in body:  # it makes an engine hold or read KV blocks
        raise APIError(
            400,
            "`kv_transfer_params` is set by the router (prefill/decode disaggregation); "
            "send the request without it.",
            "kv_transfer_params",
        )
    try:
        fields: dict[str, Any] = _FIELDS[endpoint].validate_python(body)
    except ValidationError as error:
        raise _field_error(error) from None
    if endpoint == "completions" and "prompt" not in fields:
        raise APIError(400, "`prompt` is required.", "prompt")
    return fields


def _chat_body(body: dict[str, Any], endpoint: Endpoint) -> dict[str, Any]:
    """What the chat template renders for a chat, Responses or Messages body (a chained
    Responses turn: its own part only; the router routes its history by the chain)."""
    if endpoint == "responses":
        return responses_chat_body(body)
    if endpoint == "messages":
        return messages_chat_body(body)
    return body


def _field_error(error: ValidationError) -> APIError:
    item = error.errors(include_url=False, include_input=False)[0]
    location = item["loc"]
    param = str(location[0]) if location else None
    if param == "prompt":
        return APIError(400, PROMPT_SHAPE, param)
    path = ".".join(str(part) for part in location)
    message = item["msg"]
    if item["type"] == "missing":
        message = "is required"
    return APIError(400, f"`{path}`: {message}.", param)


def take_in(raw: bytes, endpoint: Endpoint, tokenizer: Tokenizer, block_size: int) -> Intake:
    """Parse, check, tokenize and hash one request body (pure; raises APIError 400)."""
    body = parse_json(raw)
    fields = check_fields(body, endpoint)
    t0 = time.perf_counter()
    turn_index: int | None = None
    special = fields.get("add_special_tokens", ADD_SPECIAL_TOKENS[endpoint])
    if endpoint == "completions":
        token_ids, mode = tokenizer.encode_prompt(fields["prompt"], add_special_tokens=special)
    else:
        chat = _chat_body(body, endpoint)
        try:  # the body itself: the template may read any message key and template option
            token_ids, mode = tokenizer.encode_chat_body(chat, add_special_tokens=special)
        except PromptError as error:
            param = RENDERED_FIELD[endpoint] if error.param == "messages" else error.param
            raise APIError(400, str(error), param) from None
        turn_index = sum(1 for message in chat["messages"] if message["role"] == "assistant")
    t1 = time.perf_counter()
    hashes = tuple(hash_blocks(token_ids, block_size))
    user = messages_user(body) if endpoint == "messages" else fields.get("user")
    return Intake(
        model=fields["model"],
        stream=bool(fields.get("stream")),
        user=compact_key(user) if user else None,
        turn_index=turn_index,
        previous_response_id=fields.get("previous_response_id"),
        prompt_tokens=len(token_ids),
        block_hashes=hashes,
        tokenization=mode,
        tokenize_s=t1 - t0,
        hash_s=time.perf_counter() - t1,
    )


# ----- the worker process side ------------------------------------------------------------
_WORKER_TOKENIZERS: dict[tuple[str | None, str], Tokenizer] = {}


def take_in_with(raw: bytes, endpoint: Endpoint, settings: IntakeSettings) -> Intake:
    """:func:`take_in` in a worker process, with a tokenizer loaded once per settings."""
    key = (settings.tokenizer_path, settings.chat_template)
    tokenizer = _WORKER_TOKENIZERS.get(key)
    if tokenizer is None:
        tokenizer = _WORKER_TOKENIZERS[key] = Tokenizer(*key)
    return take_in(raw, endpoint, tokenizer, settings.block_size)


def _start_worker(router_pid: int) -> None:
    """Worker processes yield the CPU to the router's event loop (the loop relays every
    stream; a big body's intake is one request's bulk work), and die with the router: a
    SIGKILLed router leaves no worker behind (each holds both ends of its task pipe, so
    it would never see end-of-file)."""
    os.nice(WORKER_NICENESS)
    threading.Thread(
        target=_exit_when_orphaned, args=(router_pid,), daemon=True, name="intake-orphan-watch"
    ).start()


def _exit_when_orphaned(router_pid: int) -> None:
    while os.getppid() == router_pid:
        time.sleep(ORPHAN_CHECK_S)
    os._exit(1)


class IntakeRunner:
    """Takes small bodies in inline and big ones in a process pool (started on first use).

    At most one body per worker process is in the pool; the others wait here, in arrival
    order, bounded in count and in bytes (``router.max_intake_queue`` and
    ``max_intake_queue_bytes``; a body is always let in when nothing waits). A waiting
    body whose client has gone (its task cancelled) is dropped there, unparsed, and its
    memory released with it (``dropped``); one already in a worker finishes there and its
    result is discarded (``abandoned``).

    A worker that dies (killed, out of memory) fails only the requests it held, each
    with a 503; the next big body starts a new pool."""

    def __init__(self, workers: int = 2, metrics: RouterMetrics | None = None) -> None:
        self.workers = workers
        self.metrics = metrics
        self._pool: ProcessPoolExecutor | None = None
        self._busy = 0  # bodies in worker processes
        self._waiters: deque[asyncio.Future[None]] = deque()
        self.queued = 0  # bodies waiting or in a worker
        self.queued_bytes = 0
        self.dropped = 0  # bodies whose client went away before a worker took them
        self.abandoned = 0  # bodies whose client went away while a worker had them
        if metrics is not None:  # read at scrape time
            metrics.intake_queued.set_function(lambda: self.queued)
            metrics.intake_queued_bytes.set_function(lambda: self.queued_bytes)

    async def take_in(
        self,
        raw: bytes,
        endpoint: Endpoint,
        tokenizer: Tokenizer,
        block_size: int,
        settings: RouterSettings,
    ) -> Intake:
        if len(raw) < settings.offload_body_bytes:
            return take_in(raw, endpoint, tokenizer, block_size)
        self._admit(len(raw), settings)
        self.queued += 1
        self.queued_bytes += len(raw)
        try:
            await self._turn()
            return await self._run(raw, endpoint, tokenizer, block_size)
        finally:
            self.queued -= 1
            self.queued_bytes -= len(raw)

    def _admit(self, size: int, settings: RouterSettings) -> None:
        if not self.queued:
            return
        if (
            self.queued >= settings.max_intake_queue
            or self.queued_bytes + size > settings.max_intake_queue_bytes
        ):
            if self.metrics is not None:
                self.metrics.limit_hit("intake_queue")
            raise APIError(
                429,
                "The router is overloaded: too many large request bodies are waiting to be "
                "read; retry later.",
            )

    async def _turn(self) -> None:
        """Wait for a free worker (FIFO); a cancelled wait leaves the queue at once."""
        if self._busy < self.workers and not self._waiters:
            self._busy += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._next()  # the turn was handed over just as the client left: pass it on
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            self.dropped += 1
            if self.metrics is not None:
                self.metrics.intake_dropped.inc()
            raise

    def _next(self) -> None:
        """A worker is free: hand it to the oldest waiter, else mark it free."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._busy -= 1

    async def _run(
        self, raw: bytes, endpoint: Endpoint, tokenizer: Tokenizer, block_size: int
    ) -> Intake:
        """The body in a worker; the turn passes on once the worker is done with it (a
        client that leaves meanwhile does not free the worker any sooner)."""
        settings = IntakeSettings(tokenizer.path, tokenizer.chat_template, block_size)
        pool = self._ensure_pool()
        loop = asyncio.get_running_loop()
        try:
            try:
                future = pool.submit(take_in_with, raw, endpoint, settings)
            except BaseException:  # a broken pool refuses work: the turn was not used
                self._next()
                raise
            future.add_done_callback(partial(_call_soon, loop, self._next))
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            self.abandoned += 1  # the worker finishes the body; nobody waits for it
            if self.metrics is not None:
                self.metrics.intake_abandoned.inc()
            raise
        except BrokenProcessPool:
            log.warning("an intake worker process died; starting a new pool")
            self._discard(pool)
            raise APIError(
                503, "The router's tokenizer process failed while taking this request in; retry it."
            ) from None

    def _ensure_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # spawn, not fork: the router process runs threads (telemetry, the loop's
            # executor) that a forked child would inherit mid-operation.
            self._pool = ProcessPoolExecutor(
                self.workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_worker,
                initargs=(os.getpid(),),
            )
        return self._pool

    def _discard(self, pool: ProcessPoolExecutor) -> None:
        if self._pool is pool:
            self._pool = None
        pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        if self._pool is not None:
            self._discard(self._pool)


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[[], None], _: object) -> None:
    with contextlib.suppress(RuntimeError):  # the loop is closed: the router is stopping
        loop.call_soon_threadsafe(callback)
