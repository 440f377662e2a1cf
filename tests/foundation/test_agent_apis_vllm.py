"""engine_interface.agent_apis checked against vLLM itself, not against our own code.

The router and enginesim share agent_apis, so comparing them agrees by construction. Here
each expected value was written by hand from reading vLLM's source (vllm-project/vllm, the
files named beside each rule), for fixed request bodies: the chat messages vLLM builds
from an OpenAI Responses body (``POST /v1/responses``) and from an Anthropic Messages body
(``POST /v1/messages``), before its chat template renders them.

vLLM hands those messages to ``parse_chat_messages`` (vllm/entrypoints/chat_utils.py,
``_parse_chat_message_content``), which keeps of each message only its role, content,
tool calls, tool call id, name and reasoning, and reads an absent content as a null one.
The comparison is of that view (:func:`_template_view`): a key vLLM carries along and then
drops there (a Responses item's ``"type": "message"``) is not a difference.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from engine_interface.agent_apis import messages_chat_body, responses_chat_body

TEMPLATE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name", "reasoning")


def _template_view(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: m[k] for k in TEMPLATE_KEYS if m.get(k) is not None} for m in messages]


def _call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# ----- Responses -----------------------------------------------------------------------------
# Rules from vllm/entrypoints/openai/responses/utils.py: construct_input_messages (instructions
# first as a system message, a string input one user message, a list through
# construct_chat_messages_with_tool_call) and _construct_message_from_response_item (one item at
# a time, folding assistant-side items into the assistant message before them); function_call
# dicts become ResponseFunctionToolCall objects in ResponsesRequest.function_call_parsing
# (vllm/entrypoints/openai/responses/protocol.py).
RESPONSES_CASES: list[tuple[str, dict[str, Any], list[dict[str, Any]]]] = [
    (
        # construct_input_messages: `isinstance(request_input, str)` -> one user message.
        "plain-string-input",
        {"input": "Name three rivers."},
        [{"role": "user", "content": "Name three rivers."}],
    ),
    (
        # construct_input_messages: `request_instructions` -> the first, system, message; role
        # messages (dicts with a "role") come back unchanged from
        # _construct_message_from_response_item, an assistant's with its text
        # (`item.get("role") == "assistant"` branch).
        "instructions-and-role-messages",
        {
            "instructions": "Be brief.",
            "input": [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": "Again?"},
            ],
        },
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Again?"},
        ],
    ),
    (
        # _construct_message_from_response_item: a ResponseFunctionToolCall becomes a tool call
        # {id: call_id, type: function, function: {name, arguments}} appended to the previous
        # assistant message's tool_calls (a parallel call joins the same message); a
        # function_call_output dict becomes {"role": "tool", content: output, tool_call_id}.
        "function-call-and-output",
        {
            "input": [
                {"role": "user", "content": "Weather in Oslo and Rome?"},
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "Let me look."}],
                },
                {
                    "type": "function_call",
                    "call_id": "c1",
                    "name": "weather",
                    "arguments": '{"city": "Oslo"}',
                },
                {
                    "type": "function_call",
                    "call_id": "c2",
                    "name": "weather",
                    "arguments": '{"city": "Rome"}',
                },
                {"type": "function_call_output", "call_id": "c1", "output": "rain"},
                {"type": "function_call_output", "call_id": "c2", "output": "sun"},
            ],
        },
        [
            {"role": "user", "content": "Weather in Oslo and Rome?"},
            {
                "role": "assistant",
                "content": "Let me look.",
                "tool_calls": [
                    _call("c1", "weather", '{"city": "Oslo"}'),
                    _call("c2", "weather", '{"city": "Rome"}'),
                ],
            },
            {"role": "tool", "content": "rain", "tool_call_id": "c1"},
            {"role": "tool", "content": "sun", "tool_call_id": "c2"},
        ],
    ),
    (
        # A user message's input_text parts pass through unchanged (chat_utils reads
        # "input_text" as text). An assistant message is cut to its first part's text
        # (`text = content[0].get("text")`), and an assistant text after an assistant message
        # that already has content starts a new message (it only fills a null content).
        "input-text-parts",
        {
            "input": [
                {
                    "type": "message",
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "Part one."},
                        {"type": "input_text", "text": "Part two."},
                    ],
                },
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [
                        {"type": "output_text", "text": "First."},
                        {"type": "output_text", "text": "Second."},
                    ],
                },
                {"role": "assistant", "content": "Again."},
                {"role": "user", "content": [{"type": "input_text", "text": "Go on."}]},
            ],
        },
        [
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Part one."},
                    {"type": "input_text", "text": "Part two."},
                ],
            },
            {"role": "assistant", "content": "First."},
            {"role": "assistant", "content": "Again."},
            {"role": "user", "content": [{"type": "input_text", "text": "Go on."}]},
        ],
    ),
]


@pytest.mark.parametrize(
    ("body", "expected"),
    [pytest.param(body, expected, id=name) for name, body, expected in RESPONSES_CASES],
)
def test_responses_messages_are_vllms(body, expected):
    assert _template_view(responses_chat_body(body)["messages"]) == _template_view(expected)


# ----- Messages ------------------------------------------------------------------------------
# Rules from vllm/entrypoints/anthropic/serving.py, AnthropicServingMessages:
# _convert_system_message, _convert_messages, _convert_message_content, _convert_block,
# _convert_tool_use_block, _convert_user_tool_result, _convert_image_source_to_url, and the
# tool schema default of AnthropicTool.validate_input_schema (vllm/entrypoints/anthropic/
# protocol.py).
WEATHER_SCHEMA = {"properties": {"city": {"type": "string"}}, "required": ["city"]}
MESSAGES_CASES: list[tuple[str, dict[str, Any], list[dict[str, Any]]]] = [
    (
        # _convert_system_message: a string system is the system message as it is;
        # _convert_messages: string content stays a string.
        "system-string",
        {"max_tokens": 8, "system": "Be brief.", "messages": [{"role": "user", "content": "Hi"}]},
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    ),
    (
        # _convert_system_message: text blocks joined with "" (no separator), a block starting
        # with "x-anthropic-billing-header" skipped; a single text block of a message is a
        # plain string (_convert_message_content: `len(content_parts) == 1`).
        "system-text-blocks",
        {
            "max_tokens": 8,
            "system": [
                {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1; cch=9f;"},
                {"type": "text", "text": "You are Claude Code."},
                {"type": "text", "text": " Be terse."},
            ],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        },
        [
            {"role": "system", "content": "You are Claude Code. Be terse."},
            {"role": "user", "content": "Hi"},
        ],
    ),
    (
        # _convert_tool_use_block: {id, type: function, function: {name, arguments:
        # json.dumps(input)}} on the assistant message; _convert_user_tool_result: a tool
        # message with the result's text parts joined by "\n", appended before the user
        # message itself, then its images as a user message of image_url parts; a user
        # message left with no content of its own is not appended.
        "tool-use-and-tool-result",
        {
            "max_tokens": 8,
            "tools": [{"name": "weather", "input_schema": WEATHER_SCHEMA}],
            "messages": [
                {"role": "user", "content": "Weather in Oslo?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "Let me look."},
                        {
                            "type": "tool_use",
                            "id": "t1",
                            "name": "weather",
                            "input": {"city": "Oslo"},
                        },
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "content": [
                                {"type": "text", "text": "rain"},
                                {"type": "text", "text": "cold"},
                                {
                                    "type": "image",
                                    "source": {
                                        "type": "base64",
                                        "media_type": "image/png",
                                        "data": "AAA",
                                    },
                                },
                            ],
                        },
                    ],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "again"}],
                },
            ],
        },
        [
            {"role": "user", "content": "Weather in Oslo?"},
            {
                "role": "assistant",
                "content": "Let me look.",
                "tool_calls": [_call("t1", "weather", '{"city": "Oslo"}')],
            },
            {"role": "tool", "tool_call_id": "t1", "content": "rain\ncold"},
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA"}}
                ],
            },
            {"role": "tool", "tool_call_id": "t1", "content": "again"},
        ],
    ),
    (
        # _convert_block: text blocks and images (a url source -> its url) are content parts,
        # kept as a list when more than one; a thinking block is the message's reasoning.
        "multi-block-user-content",
        {
            "max_tokens": 8,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Look:"},
                        {
                            "type": "image",
                            "source": {"type": "url", "url": "https://img.invalid/a.png"},
                        },
                        {"type": "text", "text": "What is it?"},
                    ],
                },
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "A small animal.", "signature": "s"},
                        {"type": "text", "text": "A cat."},
                    ],
                },
            ],
        },
        [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Look:"},
                    {"type": "image_url", "image_url": {"url": "https://img.invalid/a.png"}},
                    {"type": "text", "text": "What is it?"},
                ],
            },
            {"role": "assistant", "reasoning": "A small animal.", "content": "A cat."},
        ],
    ),
]


@pytest.mark.parametrize(
    ("body", "expected"),
    [pytest.param(body, expected, id=name) for name, body, expected in MESSAGES_CASES],
)
def test_messages_messages_are_vllms(body, expected):
    assert _template_view(messages_chat_body(body)["messages"]) == _template_view(expected)


def test_messages_tool_schema_gets_its_type_appended_as_vllm_does():
    """AnthropicTool.validate_input_schema sets ``v["type"] = "object"`` when missing: the key
    goes last, and the template's ``tojson`` (transformers' keeps key order) prints it last."""
    body = MESSAGES_CASES[2][1]
    (tool,) = messages_chat_body(body)["tools"]
    assert tool["type"] == "function"
    assert tool["function"]["name"] == "weather"
    assert json.dumps(tool["function"]["parameters"]) == json.dumps(
        {**WEATHER_SCHEMA, "type": "object"}
    )
