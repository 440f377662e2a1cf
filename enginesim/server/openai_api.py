"""Request parsing and response shapes of vLLM's OpenAI-compatible API.

Output length: when the client gives ``max_tokens`` (or ``max_completion_tokens``)
exactly that many tokens are generated and ``finish_reason`` is ``"length"``, as
with vLLM's ``ignore_eos``; completions default to 16 as in vLLM. Chat requests
without a limit get a synthetic answer length of 16..256 tokens derived from the
prompt, ending with ``finish_reason`` ``"stop"``.

``add_special_tokens`` as vLLM reads it (a boolean; completions default to true, chat to
false): when true, a text prompt starts with the BOS the model's tokenizer adds
(:func:`tokenizer.added_bos`; token-id prompts are used as given).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine_interface.agent_apis import messages_chat_body, responses_chat_body
from engine_interface.openai_errors import APIError, error_dict
from enginesim.server import chat, tokenizer

COMPLETIONS_DEFAULT_MAX_TOKENS = 16
NATURAL_MIN_TOKENS = 16
NATURAL_SPAN = 241


@dataclass(slots=True)
class GenerationRequest:
    kind: str  # "chat", "completion", "responses" or "messages"
    prompt_token_ids: list[int]
    max_tokens: int
    natural_stop: bool
    stream: bool
    include_usage: bool
    seed: int
    body: dict[str, Any] | None = None  # responses, messages: the request, echoed in answers
    chat_body: dict[str, Any] | None = None  # responses: what the chain's next turn extends


# A Responses chain's earlier turns by response id (None: not stored here).
History = Callable[[str], list[dict[str, Any]] | None]


def _check_model(body: dict[str, Any], served_name: str) -> None:
    model = body.get("model")
    if model is not None and model != served_name:
        raise APIError(404, f"The model `{model}` does not exist.", "model")


def _positive_int(body: dict[str, Any], *names: str) -> int | None:
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise APIError(400, f"{name} must be a positive integer, got {value!r}", name)
        return value
    return None


def special_prefix(body: dict[str, Any], bos: str, default: bool) -> str:
    """The text the tokenizer adds before the prompt: ``bos`` if ``add_special_tokens``."""
    add = body.get("add_special_tokens", default)
    if not isinstance(add, bool):
        raise APIError(400, "add_special_tokens must be a boolean", "add_special_tokens")
    return bos if add else ""


def _completion_prompt(prompt: Any, prefix: str) -> list[int]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tokenizer.encode(prefix) + tokenizer.encode(prompt)
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt)
    ):
        largest = max(prompt)
        if largest > tokenizer.MAX_TOKEN_ID:  # vLLM's check and message
            raise APIError(400, f"Token id {largest} is out of vocabulary", "prompt")
        return list(prompt)
    raise APIError(
        400, "prompt must be a string or a list of token ids (one prompt per request)", "prompt"
    )


def _stream_flags(body: dict[str, Any]) -> tuple[bool, bool]:
    stream = bool(body.get("stream", False))
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise APIError(400, "stream_options must be an object", "stream_options")
    if options and not stream:
        raise APIError(400, "Stream options can only be defined when `stream=True`.", "stream")
    return stream, bool(options.get("include_usage", False))


def _check_n(body: dict[str, Any]) -> None:
    if body.get("n", 1) != 1:
        raise APIError(400, "enginesim supports only n=1", "n")


def _fit_length(
    prompt_ids: list[int], max_tokens: int | None, max_model_len: int
) -> tuple[int, bool]:
    """(tokens to generate, natural_stop); rejects what vLLM rejects."""
    prompt_len = len(prompt_ids)
    if max_tokens is None:
        if prompt_len >= max_model_len:
            raise APIError(
                400,
                f"This model's maximum context length is {max_model_len} tokens. "
                f"However, your request has {prompt_len} input tokens. "
                "Please reduce the length of the input messages.",
            )
        natural = NATURAL_MIN_TOKENS + tokenizer.prompt_seed(prompt_ids) % NATURAL_SPAN
        return min(natural, max_model_len - prompt_len), True
    if prompt_len + max_tokens > max_model_len:
        raise APIError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. "
            f"However, you requested {prompt_len + max_tokens} tokens ({prompt_len} in the "
            f"messages, {max_tokens} in the completion). "
            "Please reduce the length of the messages or completion.",
        )
    return max_tokens, False


def parse_completion(
    body: Any, served_name: str, max_model_len: int, bos: str = ""
) -> GenerationRequest:
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object")
    _check_model(body, served_name)
    _check_n(body)
    if "prompt" not in body:
        raise APIError(400, "prompt is required", "prompt")
    prompt_ids = _completion_prompt(body["prompt"], special_prefix(body, bos, default=True))
    limit = _positive_int(body, "max_tokens")
    max_tokens, natural = _fit_length(
        prompt_ids, limit or COMPLETIONS_DEFAULT_MAX_TOKENS, max_model_len
    )
    stream, include_usage = _stream_flags(body)
    seed = tokenizer.prompt_seed(prompt_ids)
    return GenerationRequest(
        "completion", prompt_ids, max_tokens, natural, stream, include_usage, seed
    )


def parse_chat(
    body: Any,
    served_name: str,
    max_model_len: int,
    template: chat.ChatTemplate | None = None,
    bos: str = "",
) -> GenerationRequest:
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object")
    _check_model(body, served_name)
    _check_n(body)
    limit = _positive_int(body, "max_completion_tokens", "max_tokens")
    gen = _rendered("chat", body, body, limit, max_model_len, template, bos)
    gen.stream, gen.include_usage = _stream_flags(body)
    return gen


def parse_responses(
    body: Any,
    served_name: str,
    max_model_len: int,
    template: chat.ChatTemplate | None = None,
    bos: str = "",
    history: History | None = None,
) -> GenerationRequest:
    """A Responses request as vLLM reads it; a ``previous_response_id`` this engine does
    not hold is vLLM's 404."""
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object")
    _check_model(body, served_name)
    previous = body.get("previous_response_id")
    turns = None
    if previous is not None:
        if not isinstance(previous, str):
            raise APIError(400, "previous_response_id must be a string", "previous_response_id")
        turns = history(previous) if history is not None else None
        if turns is None:
            raise APIError(404, f"Response with id '{previous}' not found.", "previous_response_id")
    chat_body = responses_chat_body(body, turns)
    limit = _positive_int(body, "max_output_tokens")
    gen = _rendered("responses", body, chat_body, limit, max_model_len, template, bos)
    gen.stream, gen.body, gen.chat_body = bool(body.get("stream")), body, chat_body
    return gen


def parse_messages(
    body: Any,
    served_name: str,
    max_model_len: int,
    template: chat.ChatTemplate | None = None,
    bos: str = "",
) -> GenerationRequest:
    """An Anthropic Messages request as vLLM reads it (``max_tokens`` is required)."""
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object")
    _check_model(body, served_name)
    limit = _positive_int(body, "max_tokens")
    if limit is None:
        raise APIError(400, "max_tokens is required", "max_tokens")
    gen = _rendered("messages", body, messages_chat_body(body), limit, max_model_len, template, bos)
    gen.stream, gen.include_usage, gen.body = bool(body.get("stream")), True, body
    return gen


def _rendered(
    kind: str,
    body: dict[str, Any],
    chat_body: dict[str, Any],
    limit: int | None,
    max_model_len: int,
    template: chat.ChatTemplate | None,
    bos: str,
) -> GenerationRequest:
    """A request whose prompt is ``chat_body`` rendered with the chat template."""
    text = render_chat_request(chat_body, template)
    prefix = special_prefix(body, bos, default=False)
    prompt_ids = tokenizer.encode(prefix) + tokenizer.encode(text)
    max_tokens, natural = _fit_length(prompt_ids, limit, max_model_len)
    seed = tokenizer.prompt_seed(prompt_ids)
    return GenerationRequest(kind, prompt_ids, max_tokens, natural, False, False, seed)


def render_chat_request(body: dict[str, Any], template: chat.ChatTemplate | None) -> str:
    """The prompt text of a chat body; what the template cannot render is a 400."""
    try:
        return chat.render_request(body, template)
    except chat.ChatTemplateError as exc:
        raise APIError(400, exc.message, exc.param) from None


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def full_response(
    kind: str,
    req_id: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str | None,
    usage_info: dict[str, Any],
    kv_transfer_params: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The non-streaming body of a chat or text completion."""
    if kind == "chat":
        message: dict[str, Any] = {
            "role": "assistant",
            "content": text,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "tool_calls": [],
            "reasoning_content": None,
        }
        choice = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
        }
        return {
            "id": req_id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": None,
            "usage": usage_info,
            "prompt_logprobs": None,
            "kv_transfer_params": kv_transfer_params,
        }
    choice = {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": finish_reason,
        "stop_reason": None,
        "prompt_logprobs": None,
    }
    return {
        "id": req_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": usage_info,
        "kv_transfer_params": kv_transfer_params,
    }


DONE_EVENT = b"data: [DONE]\n\n"


def dumps(obj: Any) -> str:
    """Compact JSON, as vLLM's pydantic serialisation writes it."""
    return json.dumps(obj, separators=(",", ":"))


def sse(payload: str) -> bytes:
    return b"data: " + payload.encode() + b"\n\n"


@dataclass(slots=True)
class Outcome:
    """How a request ended, for its last events or whole body."""

    prompt_tokens: int
    output_tokens: int
    cached_tokens: int
    finish_reason: str | None
    answer: Callable[[], str]  # the whole generated text (built only when asked for)


class ChunkRenderer:
    """SSE chunks of one streamed response, rendered from pre-built JSON fragments.

    Every API's renderer answers ``opening``, ``content_chunk``, ``closing`` and ``whole``
    (this one: chat and completions; :mod:`enginesim.server.agent_api`: responses and
    messages)."""

    def __init__(self, kind: str, req_id: str, created: int, model: str) -> None:
        self.kind = kind
        self.req_id, self.created, self.model = req_id, created, model
        obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
        head = dumps({"id": req_id, "object": obj, "created": created, "model": model})
        self._head = head[:-1] + ',"choices":'
        if kind == "chat":
            self._open = self._head + '[{"index":0,"delta":{"content":'
            self._close = '},"logprobs":null,"finish_reason":'
        else:
            self._open = self._head + '[{"index":0,"text":'
            self._close = ',"logprobs":null,"finish_reason":'

    def role_chunk(self) -> bytes:
        return sse(
            self._head + '[{"index":0,"delta":{"role":"assistant","content":""},'
            '"logprobs":null,"finish_reason":null}]}'
        )

    def content_chunk(
        self, text: str, finish_reason: str | None = None, json_safe: bool = False
    ) -> bytes:
        """``json_safe``: the text needs no JSON escaping (synthetic text never does)."""
        quoted = f'"{text}"' if json_safe else dumps(text)
        reason = "null" if finish_reason is None else dumps(finish_reason)
        return sse(self._open + quoted + self._close + reason + ',"stop_reason":null}]}')

    def opening(self) -> list[bytes]:
        return [self.role_chunk()] if self.kind == "chat" else []

    def closing(self, outcome: Outcome, include_usage: bool) -> list[bytes]:
        chunks = [DONE_EVENT]
        if include_usage:
            info = usage(outcome.prompt_tokens, outcome.output_tokens, outcome.cached_tokens)
            chunks.insert(0, self.usage_chunk(info))
        return chunks

    def whole(self, outcome: Outcome) -> dict[str, Any]:
        info = usage(outcome.prompt_tokens, outcome.output_tokens, outcome.cached_tokens)
        return full_response(
            self.kind,
            self.req_id,
            self.created,
            self.model,
            outcome.answer(),
            outcome.finish_reason,
            info,
        )

    def usage_chunk(self, usage_info: dict[str, Any]) -> bytes:
        return sse(self._head + '[],"usage":' + dumps(usage_info) + "}")

    @staticmethod
    def error_chunk(status: int, message: str) -> bytes:
        return sse(dumps(error_dict(status, message)))
