"""The continuation's request and splice, on hand-written bodies and events (the end-to-end
behaviour against enginesim: tests/router/test_continuation.py)."""

from __future__ import annotations

import json

import pytest

from router_worker.continuation import (
    Splice,
    assemble_answer,
    continuation_body,
    streamed_upstream,
    why_not_continuable,
)

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


def test_a_whole_request_goes_upstream_as_a_stream_with_usage():
    raw = json.dumps(COMPLETION).encode() + b"\n"
    upstream = json.loads(streamed_upstream(raw, False) or b"null")
    assert upstream == COMPLETION | {"stream": True, "stream_options": {"include_usage": True}}
    explicit = json.dumps(CHAT | {"stream": False}).encode()
    assert json.loads(streamed_upstream(explicit, True) or b"null")["stream"] is True


@pytest.mark.parametrize(
    "body",
    [
        COMPLETION | {"echo": True},  # cannot be continued
        COMPLETION | {"stream": True},  # a stream already
        COMPLETION | {"stream_options": {"include_usage": True}},  # the engine's 400
        [1, 2],
    ],
)
def test_what_is_not_asked_as_a_stream(body):
    assert streamed_upstream(json.dumps(body).encode(), False) is None
    assert streamed_upstream(b"{not json", False) is None


def _sse(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def test_assembled_chat_answer_has_the_whole_shape():
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 5, "model": "m"}
    events = [
        head | {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        head | {"choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": None}]},
        head
        | {
            "choices": [
                {"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop", "stop_reason": 7}
            ]
        },
        head | {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2}},
    ]
    answer = json.loads(assemble_answer(b"".join(map(_sse, events)) + b"data: [DONE]\n\n", True, 0))
    assert answer["object"] == "chat.completion" and answer["id"] == "chatcmpl-1"
    choice = answer["choices"][0]
    assert choice["message"]["content"] == "Hello" and choice["message"]["role"] == "assistant"
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", 7)
    assert answer["usage"] == {"prompt_tokens": 4, "completion_tokens": 2}
    assert answer["kv_transfer_params"] is None and answer["prompt_logprobs"] is None


def test_assembled_answer_whose_usage_was_lost_counts_it():
    head = {"id": "cmpl-1", "object": "text_completion", "created": 5, "model": "m"}
    events = [head | {"choices": [{"index": 0, "text": t, "finish_reason": None}]} for t in "abc"]
    answer = json.loads(assemble_answer(b"".join(map(_sse, events)), False, 9))
    assert answer["object"] == "text_completion" and answer["choices"][0]["text"] == "abc"
    assert answer["usage"]["prompt_tokens"] == 9 and answer["usage"]["completion_tokens"] == 3
    assert answer["usage"]["total_tokens"] == 12
