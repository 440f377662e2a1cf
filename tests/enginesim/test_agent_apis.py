"""vLLM's Responses and Anthropic Messages endpoints on enginesim, driven by the OpenAI and
Anthropic SDKs over loopback: the prompt rendered as vLLM renders it, the answers and
streamed events in vLLM's shapes, a ``previous_response_id`` chain, errors in each API's
own shape."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest

from engine_interface.agent_apis import messages_chat_body, responses_chat_body
from enginesim.server import tokenizer
from enginesim.server.chat import render_request

MODEL = "Qwen/Qwen2-7B-Instruct"


@pytest.fixture(scope="module")
def client(sim) -> openai.OpenAI:
    return openai.OpenAI(base_url=sim.url(0) + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def claude(sim) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=sim.url(0), api_key="unused", max_retries=0)


def _prompt_ids(chat_body: dict) -> list[int]:
    return tokenizer.encode(render_request(chat_body))


def _answer(prompt_ids: list[int], tokens: int) -> str:
    return tokenizer.SyntheticText(tokenizer.prompt_seed(prompt_ids)).text(0, tokens)


def test_responses_whole(client):
    reply = client.responses.create(
        model=MODEL, instructions="Be brief.", input="Name three rivers.", max_output_tokens=7
    )
    chat = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Name three rivers."},
        ]
    }
    ids = _prompt_ids(chat)
    assert reply.object == "response" and reply.id.startswith("resp_")
    assert reply.status == "incomplete" and reply.incomplete_details.reason == "max_output_tokens"
    assert reply.output_text == _answer(ids, 7)
    assert reply.usage.input_tokens == len(ids)
    assert reply.usage.output_tokens == 7
    assert reply.usage.total_tokens == len(ids) + 7


def test_responses_stream_events(client):
    stream = client.responses.create(model=MODEL, input="Count to five.", stream=True)
    events = list(stream)
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[2:4] == ["response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert final.status == "completed" and final.output_text == text
    ids = _prompt_ids({"messages": [{"role": "user", "content": "Count to five."}]})
    assert text == _answer(ids, final.usage.output_tokens)


def test_responses_chain_extends_the_stored_conversation(client):
    first = client.responses.create(model=MODEL, input="Hello there.", max_output_tokens=5)
    second = client.responses.create(
        model=MODEL, input="And then?", previous_response_id=first.id, max_output_tokens=5
    )
    history = [
        {"role": "user", "content": "Hello there."},
        {"role": "assistant", "content": first.output_text},
    ]
    expected = responses_chat_body({"input": "And then?"}, history)
    assert second.usage.input_tokens == len(_prompt_ids(expected))
    # the second turn's prompt starts with the first's: its blocks are cached
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 16
    assert second.previous_response_id == first.id


def test_responses_unknown_previous_id_is_vllms_404(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.create(model=MODEL, input="hi", previous_response_id="resp_nope")
    body = caught.value.body
    assert isinstance(body, dict) and body["param"] == "previous_response_id"


def test_responses_bad_input_names_the_field(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL, input=[{"type": "bogus"}])
    body = caught.value.body
    assert isinstance(body, dict) and body["param"] == "input"


def test_messages_whole(claude):
    reply = claude.messages.create(
        model=MODEL,
        max_tokens=6,
        system="You are terse.",
        messages=[{"role": "user", "content": [{"type": "text", "text": "Why is the sky blue?"}]}],
    )
    chat = messages_chat_body(
        {
            "system": "You are terse.",
            "messages": [{"role": "user", "content": "Why is the sky blue?"}],
        }
    )
    ids = _prompt_ids(chat)
    assert reply.type == "message" and reply.role == "assistant"
    assert reply.stop_reason == "max_tokens"
    assert reply.content[0].text == _answer(ids, 6)
    assert reply.usage.input_tokens == len(ids) and reply.usage.output_tokens == 6


def test_messages_stream_events(claude):
    with claude.messages.stream(
        model=MODEL, max_tokens=11, messages=[{"role": "user", "content": "Tell a story."}]
    ) as stream:
        kinds = [event.type for event in stream]
        message = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[1] == "content_block_start"
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 11
    ids = _prompt_ids({"messages": [{"role": "user", "content": "Tell a story."}]})
    assert message.content[0].text == _answer(ids, 11)


def test_messages_errors_in_anthropics_shape(sim):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}  # no max_tokens
    answer = httpx.post(sim.url(0) + "/v1/messages", json=body)
    assert answer.status_code == 400
    assert answer.json() == {
        "type": "error",
        "error": {"type": "BadRequestError", "message": "max_tokens is required"},
    }
