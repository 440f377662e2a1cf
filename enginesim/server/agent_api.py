"""The answers of vLLM's Responses (``/v1/responses``) and Anthropic Messages
(``/v1/messages``) endpoints: whole bodies and streamed events, in vLLM's shapes.

Responses (vLLM's ``OpenAIServingResponses``, text output): a ``response`` object (id
``resp_…``; status ``completed``, or ``incomplete`` with reason ``max_output_tokens`` when
the limit cut it) whose output is one assistant ``message`` item with one ``output_text``
part; usage as ``input_tokens`` (with ``cached_tokens``), ``output_tokens`` and
``total_tokens``. Streamed as named SSE events, each with its ``sequence_number``:
``response.created``, ``response.in_progress``, then with the first text
``response.output_item.added`` and ``response.content_part.added``, one
``response.output_text.delta`` per chunk, and at the end ``response.output_text.done``,
``response.content_part.done``, ``response.output_item.done`` and ``response.completed``
(no ``[DONE]``).

Messages (vLLM's ``AnthropicServingMessages``, which converts a chat completion): a
``message`` with one ``text`` block, ``stop_reason`` ``end_turn`` or ``max_tokens`` and
usage ``input_tokens``/``output_tokens``. Streamed as ``message_start``, then
``content_block_start`` (with the first text) and a ``content_block_delta`` of type
``text_delta`` per chunk, then ``content_block_stop``, ``message_delta`` (stop reason and
usage) and ``message_stop``; unset fields are left out as vLLM's ``exclude_unset`` does.

Both render with :class:`~enginesim.server.openai_api.ChunkRenderer`'s interface.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from typing import Any

from enginesim.server.openai_api import Outcome, dumps

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}
STORED_RESPONSES = 10_000  # per instance; vLLM's store is unbounded (in memory)


def named_event(name: str, payload: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {dumps(payload)}\n\n".encode()


class ResponseStore:
    """The responses this engine answered with ``store`` (vLLM's ``msg_store``): a chain's
    next turn (``previous_response_id``) extends them; the oldest go first."""

    def __init__(self, capacity: int = STORED_RESPONSES) -> None:
        self.capacity = capacity
        self._turns: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()

    def get(self, response_id: str) -> list[dict[str, Any]] | None:
        return self._turns.get(response_id)

    def put(self, response_id: str, turns: list[dict[str, Any]]) -> None:
        self._turns[response_id] = turns
        if len(self._turns) > self.capacity:
            self._turns.popitem(last=False)


class ResponsesRenderer:
    """One Responses request's answer (``req_id`` is its ``resp_…`` id)."""

    def __init__(self, req_id: str, created: int, model: str, body: dict[str, Any]) -> None:
        self.req_id, self.created, self.model, self.body = req_id, created, model, body
        self.item_id = f"msg_{uuid.uuid4().hex}"
        self._sequence = 0
        self._started = False

    def _event(self, name: str, payload: dict[str, Any]) -> bytes:
        event = named_event(name, {**payload, "sequence_number": self._sequence, "type": name})
        self._sequence += 1
        return event

    def response(self, outcome: Outcome | None) -> dict[str, Any]:
        """The response object: in progress (``outcome`` None) or finished."""
        body = self.body
        status, incomplete = "in_progress", None
        if outcome is not None:
            status = "completed"
            if outcome.finish_reason == "length":
                status, incomplete = "incomplete", {"reason": "max_output_tokens"}
        return {
            "id": self.req_id,
            "created_at": self.created,
            "incomplete_details": incomplete,
            "instructions": body.get("instructions"),
            "metadata": body.get("metadata"),
            "model": self.model,
            "object": "response",
            "output": [] if outcome is None else [self._item(outcome.answer(), "completed")],
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "temperature": body.get("temperature"),
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "top_p": body.get("top_p"),
            "background": bool(body.get("background", False)),
            "max_output_tokens": body.get("max_output_tokens"),
            "max_tool_calls": body.get("max_tool_calls"),
            "previous_response_id": body.get("previous_response_id"),
            "prompt": None,
            "reasoning": None,
            "service_tier": body.get("service_tier", "auto"),
            "status": status,
            "text": None,
            "top_logprobs": body.get("top_logprobs"),
            "truncation": body.get("truncation", "disabled"),
            "usage": None if outcome is None else _responses_usage(outcome),
            "user": body.get("user"),
        }

    def _item(self, text: str | None, status: str) -> dict[str, Any]:
        content = [] if text is None else [_output_text(text)]
        return {
            "id": self.item_id,
            "content": content,
            "role": "assistant",
            "status": status,
            "type": "message",
        }

    def _where(self) -> dict[str, Any]:
        return {"content_index": 0, "item_id": self.item_id, "output_index": 0}

    def opening(self) -> list[bytes]:
        return [
            self._event("response.created", {"response": self.response(None)}),
            self._event("response.in_progress", {"response": self.response(None)}),
        ]

    def content_chunk(
        self, text: str, finish_reason: str | None = None, json_safe: bool = False
    ) -> bytes:
        events = b""
        if not self._started:
            self._started = True
            item = {"item": self._item(None, "in_progress"), "output_index": 0}
            events += self._event("response.output_item.added", item)
            part = {**self._where(), "part": {**_output_text(""), "logprobs": []}}
            events += self._event("response.content_part.added", part)
        delta = {**self._where(), "delta": text, "logprobs": []}
        return events + self._event("response.output_text.delta", delta)

    def closing(self, outcome: Outcome, include_usage: bool) -> list[bytes]:
        text = outcome.answer()
        where = self._where()
        return [
            self._event("response.output_text.done", {**where, "logprobs": [], "text": text}),
            self._event("response.content_part.done", {**where, "part": _output_text(text)}),
            self._event(
                "response.output_item.done",
                {"item": self._item(text, "completed"), "output_index": 0},
            ),
            self._event("response.completed", {"response": self.response(outcome)}),
        ]

    def whole(self, outcome: Outcome) -> dict[str, Any]:
        return self.response(outcome)


def _output_text(text: str) -> dict[str, Any]:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": None}


def _responses_usage(outcome: Outcome) -> dict[str, Any]:
    return {
        "input_tokens": outcome.prompt_tokens,
        "input_tokens_details": {"cached_tokens": outcome.cached_tokens},
        "output_tokens": outcome.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": outcome.prompt_tokens + outcome.output_tokens,
    }


class MessagesRenderer:
    """One Anthropic Messages request's answer (vLLM gives it the chat completion's id)."""

    def __init__(self, req_id: str, created: int, model: str, prompt_tokens: int) -> None:
        self.req_id, self.model, self.prompt_tokens = req_id, model, prompt_tokens
        self._started = False

    def opening(self) -> list[bytes]:
        message: dict[str, Any] = {
            "id": self.req_id,
            "content": [],
            "model": self.model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0},
        }
        return [named_event("message_start", {"type": "message_start", "message": message})]

    def content_chunk(
        self, text: str, finish_reason: str | None = None, json_safe: bool = False
    ) -> bytes:
        events = b""
        if not self._started:
            self._started = True
            start = {
                "type": "content_block_start",
                "content_block": {"type": "text", "text": ""},
                "index": 0,
            }
            events += named_event("content_block_start", start)
        delta = {
            "type": "content_block_delta",
            "delta": {"type": "text_delta", "text": text},
            "index": 0,
        }
        return events + named_event("content_block_delta", delta)

    def closing(self, outcome: Outcome, include_usage: bool) -> list[bytes]:
        events = []
        if self._started:
            stop = {"type": "content_block_stop", "index": 0}
            events.append(named_event("content_block_stop", stop))
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": STOP_REASONS.get(outcome.finish_reason or "stop")},
            "usage": {
                "input_tokens": outcome.prompt_tokens,
                "output_tokens": outcome.output_tokens,
            },
        }
        events.append(named_event("message_delta", delta))
        events.append(named_event("message_stop", {"type": "message_stop"}))
        return events

    def whole(self, outcome: Outcome) -> dict[str, Any]:
        text = outcome.answer()
        message: dict[str, Any] = {
            "id": self.req_id,
            "type": "message",
            "role": "assistant",
            "content": [{"type": "text", "text": text}] if text else [],
            "model": self.model,
            "usage": {
                "input_tokens": outcome.prompt_tokens,
                "output_tokens": outcome.output_tokens,
            },
        }
        reason = STOP_REASONS.get(outcome.finish_reason or "")
        if reason is not None:
            message["stop_reason"] = reason
        return message
