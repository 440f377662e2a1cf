"""The agent-era request shapes vLLM serves beside chat: OpenAI's Responses API
(``POST /v1/responses``) and Anthropic's Messages API (``POST /v1/messages``).

vLLM serves both by turning the body into chat messages and rendering those with the
model's chat template, exactly as a chat request; this module is that turn, shared by
enginesim (which serves the endpoints as vLLM does) and the router (which must render the
same prompt to hash the same blocks). Pure: no I/O, no state.

Responses (vLLM's ``OpenAIServingResponses``): ``instructions`` becomes the system message
(each request's own: earlier turns' instructions are not carried over), then the earlier
turns of a ``previous_response_id`` chain (their messages without the system one, then the
answer as an assistant message; only the engine holding the chain has them), then
``input``: a string is one user message; a list holds message items (``role`` and
``content``, string or ``input_text``/``output_text`` parts; ``id``, ``status`` and
``type`` dropped; an assistant's content is cut to its text, the first part's),
``function_call`` items (an assistant tool call) and ``function_call_output`` items (a
``tool`` message); ``reasoning`` items are skipped. The assistant items of one turn fold
into one message: a function call joins the tool calls of the assistant message before it,
an assistant text fills that message's content when it has none (two texts stay two
messages). Function tools (``{"type": "function", "name", ...}``) are passed to the
template as chat tools. The expected messages for fixed bodies, read off vLLM's own code,
are in tests/foundation/test_agent_apis_vllm.py.

Messages (vLLM's ``AnthropicServingMessages``): the top-level ``system`` (a string, or text
blocks; a Claude Code ``x-anthropic-billing-header`` block is dropped, it would defeat
prefix caching) and any ``system``-role message are joined into one system message; text
blocks become text parts (one alone: a plain string), ``thinking`` blocks the message's
``reasoning``, ``tool_use`` blocks tool calls, and a user's ``tool_result`` a ``tool``
message before it (its images a user message after that one). A tool's ``input_schema``
without a ``type`` gets ``"type": "object"`` appended. ``max_tokens`` is required.

Bad input is an :class:`~engine_interface.openai_errors.APIError` 400 naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from engine_interface.openai_errors import APIError

__all__ = [
    "BILLING_HEADER",
    "messages_chat_body",
    "messages_user",
    "responses_chat_body",
    "responses_turns",
]

BILLING_HEADER = "x-anthropic-billing-header"
ANTHROPIC_ROLES = {"user": "user", "assistant": "assistant", "system": "system"}
# Claude Code >= 2.1.154 sends these roles; vLLM reads them as user messages.
ANTHROPIC_ROLES |= {"ctx": "user", "msg": "user"}
_DROPPED_ITEM_KEYS = ("id", "status", "type")


# ----- Responses ---------------------------------------------------------------------------
def responses_chat_body(
    body: Mapping[str, Any], history: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The chat body vLLM renders for a Responses request; ``history`` is the chain's
    earlier turns (:func:`responses_turns` of the previous response), None when the
    request starts a conversation."""
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise APIError(400, "`instructions` must be a string.", "instructions")
    if instructions:
        messages.append({"role": "system", "content": instructions})
    messages += [m for m in history or [] if m.get("role") != "system"]
    messages += _input_messages(body.get("input"))
    chat: dict[str, Any] = {"messages": messages}
    tools = _responses_tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
    _template_kwargs(body, chat)
    return chat


def responses_turns(chat_body: Mapping[str, Any], answer: str) -> list[dict[str, Any]]:
    """What a stored response contributes to the next turn of its chain: its messages
    and its answer (vLLM's ``msg_store`` and output)."""
    return [*chat_body["messages"], {"role": "assistant", "content": answer}]


def _input_messages(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise APIError(400, "`input` must be a string or a non-empty list of input items.", "input")
    out: list[dict[str, Any]] = []
    for index, item in enumerate(value):
        _add_input_item(index, item, out)
    return out


def _add_input_item(index: int, item: Any, out: list[dict[str, Any]]) -> None:
    """Append the item's message to ``out``, or fold it into the assistant message before
    it, as vLLM's ``_construct_message_from_response_item`` does: a function call joins
    that message's tool calls, an assistant text fills its content if it has none."""
    where = f"input.{index}"
    if not isinstance(item, dict):
        raise APIError(400, f"`{where}` must be an object.", "input")
    kind = item.get("type", "message")
    last = out[-1] if out and out[-1].get("role") == "assistant" else None
    if kind == "message":
        message = _message_item(item, where)
        text = _assistant_text(message)
        if text is None:
            out.append(message)
        elif last is not None and last.get("content") is None:
            last["content"] = text
        else:
            out.append({"role": "assistant", "content": text})
    elif kind == "function_call":
        call = _function_call(item, where)
        if last is not None:
            last["tool_calls"] = [*(last.get("tool_calls") or []), call]
        else:
            out.append({"role": "assistant", "tool_calls": [call]})
    elif kind == "function_call_output":
        call_id, output = _string(item, "call_id", where), _string(item, "output", where)
        out.append({"role": "tool", "tool_call_id": call_id, "content": output})
    elif kind != "reasoning":
        raise APIError(
            400, f"`{where}.type`: input item type {json.dumps(kind)} is not supported.", "input"
        )


def _message_item(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(item.get("role"), str):
        raise APIError(400, f"`{where}.role` must be a string.", "input")
    return {k: v for k, v in item.items() if k not in _DROPPED_ITEM_KEYS and v is not None}


def _assistant_text(message: Mapping[str, Any]) -> str | None:
    """vLLM keeps an assistant message item's text only: the string, or its first part's."""
    if message["role"] != "assistant":
        return None
    content = message.get("content")
    if isinstance(content, list) and content and isinstance(content[0], dict):
        content = content[0].get("text")
    return content if isinstance(content, str) else None


def _function_call(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    return {
        "id": _string(item, "call_id", where),
        "type": "function",
        "function": {
            "name": _string(item, "name", where),
            "arguments": _string(item, "arguments", where),
        },
    }


def _string(item: Mapping[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise APIError(400, f"`{where}.{key}` must be a string.", "input")
    return value


def _responses_tools(tools: Any) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise APIError(400, "`tools` must be a list.", "tools")
    out = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise APIError(400, f"`tools.{index}` must be an object.", "tools")
        if tool.get("type") == "function":  # built-in tools (web search...) are not rendered
            function = {k: v for k, v in tool.items() if k not in ("type", "strict")}
            out.append({"type": "function", "function": function})
    return out


def _template_kwargs(body: Mapping[str, Any], chat: dict[str, Any]) -> None:
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None:
        chat["chat_template_kwargs"] = kwargs


# ----- Messages ----------------------------------------------------------------------------
def messages_chat_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """The chat body vLLM renders for an Anthropic Messages request."""
    raw = body.get("messages")
    if not isinstance(raw, list):
        raise APIError(400, "`messages` must be a list of messages.", "messages")
    roles = [_anthropic_role(i, m) for i, m in enumerate(raw)]
    messages: list[dict[str, Any]] = []
    system = _system_text(body.get("system"), "system") + "".join(
        _system_text(m["content"], f"messages.{i}.content")
        for i, (m, role) in enumerate(zip(raw, roles, strict=True))
        if role == "system"
    )
    if system:
        messages.append({"role": "system", "content": system})
    for index, (message, role) in enumerate(zip(raw, roles, strict=True)):
        if role != "system":
            _convert_message(index, role, message["content"], messages)
    chat: dict[str, Any] = {"messages": messages}
    tools = _anthropic_tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
    _template_kwargs(body, chat)
    return chat


def messages_user(body: Mapping[str, Any]) -> str | None:
    """The end user of a Messages request: ``metadata.user_id`` (the API's ``user``)."""
    metadata = body.get("metadata")
    user = metadata.get("user_id") if isinstance(metadata, dict) else None
    return user if isinstance(user, str) and user else None


def _anthropic_role(index: int, message: Any) -> str:
    if not isinstance(message, dict):
        raise APIError(400, f"`messages.{index}` must be an object.", "messages")
    role = ANTHROPIC_ROLES.get(message.get("role"))  # type: ignore[arg-type]
    if role is None:
        raise APIError(
            400, f"`messages.{index}.role` must be one of user, assistant, system.", "messages"
        )
    if "content" not in message:
        raise APIError(400, f"`messages.{index}.content` is required.", "messages")
    return role


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(content, list) or not all(
        isinstance(b, dict) and isinstance(b.get("type"), str) for b in content
    ):
        raise APIError(
            400, f"`{where}` must be a string or a list of content blocks with a `type`.", where
        )
    return content


def _system_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(
        block["text"]
        for block in _blocks(content, where)
        if block["type"] == "text"
        and isinstance(block.get("text"), str)
        and block["text"]
        and not block["text"].startswith(BILLING_HEADER)
    )


def _convert_message(index: int, role: str, content: Any, out: list[dict[str, Any]]) -> None:
    if isinstance(content, str):
        out.append({"role": role, "content": content})
        return
    message: dict[str, Any] = {"role": role}
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for number, block in enumerate(_blocks(content, f"messages.{index}.content")):
        where = f"messages.{index}.content.{number}"
        kind = block["type"]
        if kind == "text" and block.get("text"):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image" and isinstance(block.get("source"), dict):
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block["source"])}})
        elif kind == "thinking" and block.get("thinking") is not None:
            reasoning.append(str(block["thinking"]))
        elif kind == "tool_use":
            calls.append(_tool_call(block))
        elif kind == "tool_result":
            _tool_result(block, role, parts, out)
        elif kind not in ("text", "thinking", "redacted_thinking", "tool_reference"):
            raise APIError(
                400, f"`{where}.type`: unknown block type {json.dumps(kind)}.", "messages"
            )
    if reasoning:
        message["reasoning"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    if parts:
        only_text = len(parts) == 1 and parts[0]["type"] == "text"
        message["content"] = parts[0]["text"] if only_text else parts
    if not (role == "user" and "content" not in message):
        out.append(message)


def _image_url(source: Mapping[str, Any]) -> str:
    if source.get("type") == "url":
        return str(source.get("url", ""))
    return f"data:{source.get('media_type', 'image/jpeg')};base64,{source.get('data', '')}"


def _tool_call(block: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": block.get("id") or "call",
        "type": "function",
        "function": {
            "name": block.get("name") or "",
            "arguments": json.dumps(block.get("input") or {}),
        },
    }


def _tool_result(
    block: Mapping[str, Any], role: str, parts: list[dict[str, Any]], out: list[dict[str, Any]]
) -> None:
    content = block.get("content")
    if role != "user":
        parts.append({"type": "text", "text": f"Tool result: {content or ''}"})
        return
    items = [i for i in content if isinstance(i, dict)] if isinstance(content, list) else []
    if isinstance(content, list):
        content = "\n".join(i.get("text", "") for i in items if i.get("type") == "text")
    text = content if isinstance(content, str) else ""
    out.append({"role": "tool", "tool_call_id": block.get("tool_use_id") or "", "content": text})
    images = [
        {"type": "image_url", "image_url": {"url": _image_url(i.get("source") or {})}}
        for i in items
        if i.get("type") == "image"
    ]
    if images:  # vLLM's _convert_user_tool_result: a user message right after the tool's
        out.append({"role": "user", "content": images})


def _anthropic_tools(tools: Any) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise APIError(400, "`tools` must be a list.", "tools")
    out = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise APIError(400, f"`tools.{index}.name` must be a string.", "tools")
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise APIError(400, f"`tools.{index}.input_schema` must be an object.", "tools")
        function = {
            "name": tool["name"],
            "description": tool.get("description"),
            "parameters": schema if "type" in schema else {**schema, "type": "object"},
        }
        out.append({"type": "function", "function": function})
    return out
