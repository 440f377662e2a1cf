"""The continuation's request and splice, on hand-written bodies and events (the end-to-end
behaviour against enginesim: tests/router/test_continuation.py)."""

from __future__ import annotations

import json

import pytest

from router_worker.continuation import Splice, continuation_body, why_not_continuable

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}
COMPLETION = {"model": "m", "prompt": "Once", "max_tokens": 10}


@pytest.mark.parametrize(
    ("extra", "chat", "reason"),
    [
        ({"n": 2}, True, "n > 1"),
        ({"best_of": 3}, False, "n > 1"),
        ({"echo": True}, False, "echo"),
        ({"logprobs": 2}, False, "logprobs"),
        ({"response_format": {"type": "json_object"}}, True, "structured output"),
        ({"guided_regex": "a+"}, False, "structured output"),
        ({"tools": [{"type": "function"}]}, True, "tools"),
        ({"prompt": [1, 2, 3]}, False, "the prompt is not one text"),
        ({"messages": []}, True, "no messages"),
    ],
)
def test_what_cannot_be_continued_says_why(extra, chat, reason):
    body = (CHAT if chat else COMPLETION) | extra
    assert why_not_continuable(body, chat).startswith(reason)


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"tools": [{"type": "function"}], "tool_choice": "none"},
        {"response_format": {"type": "text"}},
    ],
)
def test_plain_requests_can_be_continued(extra):
    assert why_not_continuable(CHAT | extra, True) == ""
    assert why_not_continuable(COMPLETION, False) == ""


def test_completion_continues_the_prompt_with_fewer_tokens():
    body = continuation_body(COMPLETION | {"min_tokens": 5}, False, " upon a", 2)
    assert body == COMPLETION | {"prompt": "Once upon a", "max_tokens": 8, "min_tokens": 3}
    default = continuation_body({"prompt": ["Once"]}, False, " upon", 1)
    assert default == {"prompt": "Once upon", "max_tokens": 15}  # vLLM's default of 16


def test_chat_continues_the_partial_assistant_message():
    body = continuation_body(CHAT | {"max_completion_tokens": 10}, True, "Hello there", 2)
    assert body["messages"][-1] == {"role": "assistant", "content": "Hello there"}
    assert body["add_generation_prompt"] is False and body["continue_final_message"] is True
    assert (body["max_tokens"], body["max_completion_tokens"]) == (8, 8)
    assert CHAT["messages"] == [{"role": "user", "content": "hi"}]  # the client's untouched
    prefilled = CHAT | {
        "messages": [*CHAT["messages"], {"role": "assistant", "content": "Sure:"}],
        "continue_final_message": True,
        "add_generation_prompt": False,
    }
    again = continuation_body(prefilled, True, " one", 1)
    assert again["messages"][-1] == {"role": "assistant", "content": "Sure: one"}
    assert len(again["messages"]) == 2


def _event(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _chunk(id_: str, text: str | None = None, role: bool = False) -> bytes:
    delta = {"role": "assistant", "content": ""} if role else {"content": text}
    return _event({"id": id_, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})


def test_splice_joins_a_continuation_to_the_answer():
    splice = Splice()
    for chunk in (_chunk("a", role=True), _chunk("a", "Hello"), _chunk("a", " there")):
        splice.record(chunk)
    why, answer = splice.prepare(json.dumps(CHAT).encode(), chat=True)
    assert (why, answer.text, answer.tokens, answer.finished) == ("", "Hello there", 2, False)
    sent = json.loads(splice.body or b"")
    assert sent["messages"][-1]["content"] == "Hello there" and sent["max_tokens"] == 8
    first = splice.join(_chunk("b", role=True) + _chunk("b", " friend"))
    assert first == _chunk("a", " friend")  # its role event dropped, the answer's id
    usage = {"prompt_tokens": 12, "completion_tokens": 8, "total_tokens": 20}
    fixed = json.loads(splice.rewrite(_event({"id": "b", "choices": [], "usage": usage}))[6:])
    assert fixed["id"] == "a"
    assert fixed["usage"] == {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20}


def test_nothing_left_to_generate_is_not_continued():
    splice = Splice()
    splice.record(_event({"id": "a", "choices": [{"index": 0, "text": " x"}]}))
    why, _ = splice.prepare(json.dumps(COMPLETION | {"max_tokens": 1}).encode(), chat=False)
    assert why == "no token left to generate"
