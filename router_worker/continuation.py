"""Continuing an answer that an engine broke off after its first byte.

When an instance fails mid-stream (the connection cut, garbage, an error event, silence
past the read timeout), the lifecycle's continuation rule (``routing.lifecycle``) may send
the request again, to another instance, *as a continuation*: the body asks for the rest of
the answer only, and the new stream is spliced into the client's so that the client sees
one answer.

The continuation's body (:func:`continuation_body`), built from the client's own:

* completions: the text already sent appended to the prompt;
* chat: the text already sent as the partial assistant message, last, with vLLM's
  ``continue_final_message: true`` and ``add_generation_prompt: false`` (appended to the
  final assistant message if the client already asked to continue one);
* ``max_tokens`` (chat: ``max_completion_tokens`` too) and ``min_tokens`` reduced by the
  tokens already sent; completions without ``max_tokens`` get vLLM's default (16) minus
  them.

The tokens already sent are the content-bearing events relayed (vLLM streams one token
per event at its default ``stream_interval`` of 1; enginesim the same at its default).

Splicing (:class:`Splice`, driven by the relay): the continuation's role event (chat's
first, ``{"role":"assistant","content":""}``) is dropped, its events carry the answer's
first id instead of their own, and its usage is rewritten so it adds up: the text sent is
counted as completion, not as prompt (``total_tokens`` is unchanged). The relay writes
one ``[DONE]``: the broken stream never sent its own.

A request that cannot be continued (:func:`why_not_continuable`) fails as before (an SSE
error event and ``[DONE]``), the error naming the reason.

Non-streamed requests (:func:`streamed_upstream`): an engine's whole answer is all or
nothing, so one that dies mid-generation leaves nothing to continue from. A continuable
non-streamed request is therefore asked of the engine as a stream (``stream: true`` with
usage); the router keeps the events as they arrive, continues the answer like a stream's
when the engine breaks it off, and answers the client with one body in vLLM's
non-streamed shape (:func:`assemble_answer`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # vLLM's default for /v1/completions
STRUCTURED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
_ID_RE = re.compile(rb'"id":"([^"\\]*)"')


def why_not_continuable(body: Any, chat: bool) -> str:
    """Why a request with this (parsed) body cannot be continued; empty if it can."""
    if not isinstance(body, dict):
        return "the request body is not a JSON object"
    if body.get("n", 1) != 1 or (body.get("best_of") or 1) != 1:
        return "n > 1 (several answers)"
    if body.get("echo"):
        return "echo (the prompt is part of the answer)"
    if body.get("logprobs") or body.get("prompt_logprobs"):
        return "logprobs (their offsets would restart)"
    response_format = body.get("response_format")
    structured = isinstance(response_format, dict) and response_format.get("type") != "text"
    if structured or body.get("structured_outputs") or any(body.get(k) for k in STRUCTURED):
        return "structured output (the grammar would restart)"
    if body.get("tools") and body.get("tool_choice", "auto") != "none":
        return "tools (tool calls are not content)"
    return _why_not_chat(body) if chat else _why_not_completion(body)


def _why_not_completion(body: dict[str, Any]) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    return "" if isinstance(prompt, str) else "the prompt is not one text"


def _why_not_chat(body: dict[str, Any]) -> str:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "no messages"
    last = messages[-1]
    if not isinstance(last, dict):
        return "the final message is not an object"
    if body.get("continue_final_message") and not isinstance(last.get("content"), str):
        return "the final message to continue is not one text"
    return ""


def streamed_upstream(raw: bytes, chat: bool) -> bytes | None:
    """The body a non-streamed request goes upstream with so that its answer can be
    continued: the client's, asking for a stream with usage. None when it goes as it is:
    it cannot be continued, is not a non-streamed request, or sets ``stream_options``
    (which the engine refuses without ``stream``: the client gets the engine's 400)."""
    try:
        body = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(body, dict) or body.get("stream") or "stream_options" in body:
        return None
    if why_not_continuable(body, chat):
        return None
    if "stream" in body:
        upstream = body | {"stream": True, "stream_options": {"include_usage": True}}
        return json.dumps(upstream, separators=(",", ":")).encode()
    # The usual case: the two fields appended to the client's bytes (the object is not
    # empty: it has a prompt or messages).
    return raw.rstrip()[:-1] + b',"stream":true,"stream_options":{"include_usage":true}}'


def continuation_body(body: dict[str, Any], chat: bool, text: str, sent: int) -> dict[str, Any]:
    """The body that asks for the rest of the answer, ``text`` (``sent`` tokens) being what
    the client already has. ``body``: the client's (continuable) body, left unchanged."""
    out = dict(body)
    if chat:
        if text:
            out["messages"] = _with_partial_answer(body, text)
            out["add_generation_prompt"] = False
            out["continue_final_message"] = True
        limits = [k for k in ("max_completion_tokens", "max_tokens") if k in body]
    else:
        prompt = body["prompt"]
        out["prompt"] = (prompt[0] if isinstance(prompt, list) else prompt) + text
        out.setdefault("max_tokens", COMPLETIONS_DEFAULT_MAX_TOKENS)
        limits = ["max_tokens"]
    for name in limits:
        if isinstance(out[name], int):
            out[name] = out[name] - sent
    if isinstance(body.get("min_tokens"), int):
        out["min_tokens"] = max(0, body["min_tokens"] - sent)
    return out


def _with_partial_answer(body: dict[str, Any], text: str) -> list[Any]:
    messages = list(body["messages"])
    if body.get("continue_final_message"):
        last = messages[-1]
        messages[-1] = {**last, "content": last["content"] + text}
    else:
        messages.append({"role": "assistant", "content": text})
    return messages


def remaining_tokens(body: dict[str, Any], chat: bool) -> int | None:
    """What a continuation body still asks for (None: no limit)."""
    names = ("max_completion_tokens", "max_tokens") if chat else ("max_tokens",)
    for name in names:
        value = body.get(name)
        if isinstance(value, int):
            return value
    return None


@dataclass(slots=True)
class Answer:
    """What the client has of the answer so far, read back from the relayed events."""

    text: str = ""
    tokens: int = 0  # content-bearing events
    finished: bool = False  # an event carried a finish_reason


def read_answer(relayed: bytes, chat: bool) -> Answer:
    """The answer's text, tokens and completion in the events relayed so far."""
    answer = Answer()
    parts = []
    for event in _json_events(relayed):
        for choice in event.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
            if isinstance(piece, str) and piece:
                parts.append(piece)
                answer.tokens += 1
            if choice.get("finish_reason") is not None:
                answer.finished = True
    answer.text = "".join(parts)
    return answer


def assemble_answer(relayed: bytes, chat: bool, prompt_tokens: int) -> bytes:
    """One body in vLLM's non-streamed shape from the events relayed (across attempts: a
    continuation's joined as for a stream): the text, the finish, the usage (counted here
    from ``prompt_tokens`` and the tokens when the engine's was lost with the stream's
    end). The keys a non-streamed answer has and the events do not take the values vLLM
    gives them for a request that can be continued (no logprobs, tools nor KV transfer)."""
    head: dict[str, Any] = {}
    parts: list[str] = []
    thoughts: list[str] = []
    finish: Any = None
    stop: Any = None
    usage: Any = None
    for event in _json_events(relayed):
        head = head or event
        if isinstance(event.get("usage"), dict):
            usage = event["usage"]
        for each in event.get("choices") or ():
            if not isinstance(each, dict) or each.get("index", 0) != 0:
                continue
            delta = (each.get("delta") or {}) if chat else each
            piece = delta.get("content") if chat else delta.get("text")
            if isinstance(piece, str) and piece:
                parts.append(piece)
            thought = delta.get("reasoning_content") if chat else None
            if isinstance(thought, str):
                thoughts.append(thought)
            if each.get("finish_reason") is not None:
                finish, stop = each["finish_reason"], each.get("stop_reason")
    if usage is None:
        usage = _counted_usage(prompt_tokens, len(parts))
    top = {k: head.get(k) for k in ("id", "object", "created", "model")}
    text = "".join(parts)
    choice: dict[str, Any] = {"index": 0}
    if chat:
        top["object"] = "chat.completion"
        choice["message"] = {
            "role": "assistant",
            "content": text,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "tool_calls": [],
            "reasoning_content": "".join(thoughts) if thoughts else None,
        }
    else:
        top["object"] = "text_completion"
        choice["text"] = text
    choice |= {"logprobs": None, "finish_reason": finish, "stop_reason": stop}
    if not chat:
        choice["prompt_logprobs"] = None
    answer = top | {
        "choices": [choice],
        "service_tier": head.get("service_tier"),
        "system_fingerprint": head.get("system_fingerprint"),
        "usage": usage,
    }
    if chat:
        answer["prompt_logprobs"] = None
    answer["kv_transfer_params"] = None
    return json.dumps(answer, separators=(",", ":")).encode()


def _counted_usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
    }


def _json_events(data: bytes) -> Iterator[dict[str, Any]]:
    for line in data.split(b"\n"):
        payload = line.rstrip(b"\r")[5:].strip() if line.startswith(b"data:") else b""
        if payload.startswith(b"{"):
            try:
                event = json.loads(payload)
            except ValueError:
                continue
            if isinstance(event, dict):
                yield event


def engine_error_event(data: bytes) -> bool:
    """Whether relayed-to-be events hold an engine's error event (vLLM writes one,
    ``{"error": ...}`` or ``{"object":"error", ...}``, when a request fails mid-stream)."""
    return b'data: {"error"' in data or b'"object":"error"' in data


@dataclass(slots=True)
class Splice:
    """The client's answer across attempts: what it was sent, and how a continuation's
    events are rewritten to join it."""

    relayed: list[bytes] = field(default_factory=list)  # every chunk sent to the client
    answer_id: bytes = b""  # the first attempt's ``"id"``
    body: bytes | None = None  # the continuation's body, once prepared
    sent: int = 0  # tokens the client had when the continuation was prepared
    joining: bool = False  # the current attempt is a continuation
    own_id: bytes = b""  # the continuation's id, replaced by ``answer_id``
    kept_bytes: int = 0  # the size of ``relayed``

    def record(self, chunk: bytes) -> None:
        if not self.answer_id:
            found = _ID_RE.search(chunk)
            if found:
                self.answer_id = found.group(1)
        self.relayed.append(chunk)
        self.kept_bytes += len(chunk)

    def prepare(self, raw: bytes, chat: bool) -> tuple[str, Answer]:
        """Build the continuation's body from the client's ``raw`` one; returns why it
        cannot be continued (empty if it can) and the answer so far."""
        answer = read_answer(b"".join(self.relayed), chat)
        try:
            body = json.loads(raw)
        except ValueError:
            return "the request body could not be read again", answer
        why = why_not_continuable(body, chat)
        if why:
            return why, answer
        self.sent = answer.tokens
        continued = continuation_body(body, chat, answer.text, answer.tokens)
        left = remaining_tokens(continued, chat)
        if left is not None and left < 1:
            return "no token left to generate", answer
        self.body = json.dumps(continued, separators=(",", ":")).encode()
        self.joining, self.own_id = True, b""
        return "", answer

    def join(self, first: bytes) -> bytes:
        """A continuation's first events, made part of the answer: its role event dropped
        (the client has one), its id and usage rewritten."""
        found = _ID_RE.search(first)
        self.own_id = found.group(1) if found else b""
        kept = [e for e in _split_events(first) if not _role_event(e)]
        return self.rewrite(b"".join(kept))

    def rewrite(self, chunk: bytes) -> bytes:
        """A continuation's events with the answer's id and usage (no-op otherwise)."""
        if not self.joining:
            return chunk
        if self.own_id and self.answer_id and self.own_id != self.answer_id:
            chunk = chunk.replace(b'"id":"' + self.own_id + b'"', b'"id":"' + self.answer_id + b'"')
        if b'"usage":{' in chunk:
            chunk = b"".join(_fix_usage(e, self.sent) for e in _split_events(chunk))
        return chunk


def _split_events(data: bytes) -> list[bytes]:
    """``data`` (whole events) cut into events, each with its blank line."""
    events, start = [], 0
    while start < len(data):
        end = data.find(b"\n\n", start)
        end = len(data) if end < 0 else end + 2
        events.append(data[start:end])
        start = end
    return events


def _role_event(event: bytes) -> bool:
    for parsed in _json_events(event):
        for choice in parsed.get("choices") or ():
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if isinstance(delta, dict) and "role" in delta and not delta.get("content"):
                return True
    return False


def _fix_usage(event: bytes, sent: int) -> bytes:
    """The continuation's usage as the client's answer's: the ``sent`` tokens it re-read as
    prompt were generated for the client."""
    parsed = next(_json_events(event), None)
    usage = parsed.get("usage") if parsed is not None else None
    if not isinstance(usage, dict) or not isinstance(usage.get("prompt_tokens"), int):
        return event
    prompt = max(0, usage["prompt_tokens"] - sent)
    usage["prompt_tokens"] = prompt
    usage["completion_tokens"] = int(usage.get("completion_tokens") or 0) + sent
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        details["cached_tokens"] = min(details["cached_tokens"], prompt)
    return b"data: " + json.dumps(parsed, separators=(",", ":")).encode() + b"\n\n"
