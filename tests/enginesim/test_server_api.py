"""vLLM's OpenAI-compatible surface, driven by the openai SDK over loopback (instance 0)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import openai
import pytest

from devharness import wait_until
from enginesim.server import tokenizer
from enginesim.server.chat import render_chat

MODEL = "Qwen/Qwen2-7B-Instruct"
BLOCK = 16
SKEW_S = 0.005  # two processes' CLOCK_MONOTONIC readings on different vCPUs (see below)


@pytest.fixture(scope="module")
def client(sim) -> openai.OpenAI:
    return openai.OpenAI(base_url=sim.url(0) + "/v1", api_key="unused", max_retries=0)


def _long_text(tag: str, words: int = 80) -> str:
    return " ".join(f"{tag}{i}" for i in range(words))


def _log_lines(log: Path, at_least: int) -> list[str]:
    """The request log's lines once it holds ``at_least`` of them ([] before)."""
    lines = log.read_text().splitlines() if log.exists() else []
    return lines if len(lines) >= at_least else []


def test_chat_non_stream_shape_and_usage(client):
    messages = [{"role": "user", "content": _long_text("alpha")}]
    reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12)
    prompt_ids = tokenizer.encode(render_chat(messages))
    assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-")
    assert reply.model == MODEL
    choice = reply.choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.role == "assistant"
    assert tokenizer.encode(choice.message.content) == tokenizer.SyntheticText(
        tokenizer.prompt_seed(prompt_ids)
    ).token_ids(0, 12)
    assert reply.usage.prompt_tokens == len(prompt_ids)
    assert reply.usage.completion_tokens == 12
    assert reply.usage.total_tokens == len(prompt_ids) + 12
    assert reply.usage.prompt_tokens_details.cached_tokens == 0


def test_chat_stream_with_usage_chunk(client):
    messages = [{"role": "user", "content": _long_text("beta", 40)}]
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=9, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content) == 9  # stream interval 1: one token per chunk
    assert [c.choices[0].finish_reason for c in content][-2:] == [None, "length"]
    final = chunks[-1]
    assert final.choices == []
    assert final.usage.completion_tokens == 9
    assert final.usage.prompt_tokens == len(tokenizer.encode(render_chat(messages)))
    assert final.usage.prompt_tokens_details.cached_tokens == 0


def test_multi_turn_chat_hits_the_prefix_cache(client):
    history = [{"role": "user", "content": _long_text("gamma", 120)}]
    first = client.chat.completions.create(model=MODEL, messages=history, max_tokens=20)
    first_prompt = first.usage.prompt_tokens
    history += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "and more"},
    ]
    second = client.chat.completions.create(model=MODEL, messages=history, max_tokens=5)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached % BLOCK == 0
    # the answer's blocks were cached as they were computed (all but the last token's KV)
    assert cached >= ((first_prompt + 20 - 1) // BLOCK) * BLOCK
    assert cached < second.usage.prompt_tokens


def test_completions_text_and_token_ids_agree(client):
    text = _long_text("delta", 50)
    by_text = client.completions.create(model=MODEL, prompt=text, max_tokens=6)
    ids = tokenizer.encode(text)
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=6)
    assert by_text.object == "text_completion" and by_text.id.startswith("cmpl-")
    assert by_text.usage.prompt_tokens == by_ids.usage.prompt_tokens == len(ids)
    assert by_text.choices[0].text == by_ids.choices[0].text
    # The second identical prompt finds all full blocks cached.
    assert by_ids.usage.prompt_tokens_details.cached_tokens == (len(ids) // BLOCK) * BLOCK


def test_completions_stream(client):
    stream = client.completions.create(
        model=MODEL, prompt="epsilon " * 20, max_tokens=5, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert len(texts) == 5 and all(t.startswith(" ") for t in texts)
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5


def test_chat_without_max_tokens_stops_naturally(client):
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "zeta"}]
    )
    assert reply.choices[0].finish_reason == "stop"
    assert 16 <= reply.usage.completion_tokens <= 256


def test_unknown_model_is_a_404_with_openai_error_shape(client, sim):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x", max_tokens=1)
    raw = httpx.post(sim.url(0) + "/v1/completions", json={"model": "nope", "prompt": "x"})
    error = raw.json()["error"]
    assert raw.status_code == 404
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "NotFoundError" and error["code"] == 404


def test_too_long_request_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt=[5] * 32760, max_tokens=100)
    assert "maximum context length" in str(err.value)


def test_models_health_and_tokenize(sim):
    url = sim.url(0)
    models = httpx.get(url + "/v1/models").json()
    assert models["object"] == "list"
    assert models["data"][0]["id"] == MODEL
    assert models["data"][0]["max_model_len"] == 32768
    assert httpx.get(url + "/health").status_code == 200
    messages = [{"role": "user", "content": "count these words"}]
    tok = httpx.post(url + "/tokenize", json={"messages": messages}).json()
    assert tok["tokens"] == tokenizer.encode(render_chat(messages))
    assert tok["count"] == len(tok["tokens"]) and tok["max_model_len"] == 32768
    tok_text = httpx.post(url + "/tokenize", json={"prompt": "a b c"}).json()
    assert tok_text["count"] == 3


def test_stream_interval_coalesces_tokens(sim_factory):
    server = sim_factory("--stream-interval", "4", kv_events=False)
    client = openai.OpenAI(base_url=server.url(0) + "/v1", api_key="x", max_retries=0)
    stream = client.completions.create(model=MODEL, prompt="eta", max_tokens=10, stream=True)
    pieces = [tokenizer.encode(c.choices[0].text) for c in stream if c.choices]
    assert [len(p) for p in pieces] == [4, 4, 2]


def test_request_log_times_each_request_under_the_clients_request_id(sim_factory, tmp_path):
    log = tmp_path / "requests.jsonl"
    server = sim_factory("--request-log", str(log), kv_events=False)
    client = openai.OpenAI(base_url=server.url(0) + "/v1", api_key="x", max_retries=0)
    sent = time.monotonic()
    stream = client.completions.create(
        model=MODEL,
        prompt=_long_text("theta"),
        max_tokens=6,
        stream=True,
        extra_headers={"X-Request-Id": "bench-1"},
    )
    chunks = list(stream)
    received = time.monotonic()
    assert chunks[0].id == "cmpl-bench-1"  # vLLM's id: the client's X-Request-Id
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "iota"}], max_tokens=3
    )
    assert reply.id.startswith("chatcmpl-") and reply.id != "chatcmpl-bench-1"

    # the stream's record is written as its generator closes
    lines = wait_until(lambda: _log_lines(log, 2), 5, "both requests in the request log")
    records = {r["request_id"]: r for r in map(json.loads, lines)}
    streamed = records["cmpl-bench-1"]
    assert streamed["stream"] and streamed["completed"] and streamed["instance"] == 0
    assert streamed["output_tokens"] == 6 and streamed["prompt_tokens"] >= 80
    # One clock (CLOCK_MONOTONIC) for the client and the engine: the engine's times lie
    # inside the client's, in order. Across processes on different vCPUs within a
    # millisecond or so: this VM's clock (the TSC) once put an engine's arrival 1.0 ms
    # before the client's send; another clock (time.time()) would be off by years.
    assert sent - SKEW_S < streamed["arrival"] < streamed["first_token"]
    assert streamed["first_token"] <= streamed["finished"] < received + SKEW_S
    whole = records[reply.id]
    assert not whole["stream"] and whole["completed"] and whole["output_tokens"] == 3
    assert whole["arrival"] < whole["first_token"] == whole["finished"]


def test_one_x_request_id_on_concurrent_requests_serves_both(sim):
    """Clients may reuse an id (a retry, a load tool); the engine must not refuse the
    second request as a duplicate while the first still runs."""

    async def both() -> list[openai.types.Completion]:
        client = openai.AsyncOpenAI(base_url=sim.url(0) + "/v1", api_key="x", max_retries=0)
        ask = [
            client.completions.create(
                model=MODEL,
                prompt=_long_text(f"kappa{k}"),
                max_tokens=24,
                extra_headers={"X-Request-Id": "same"},
            )
            for k in range(2)
        ]
        return await asyncio.gather(*ask)

    replies = asyncio.run(both())
    assert [r.id for r in replies] == ["cmpl-same", "cmpl-same"]
    assert [r.usage and r.usage.completion_tokens for r in replies] == [24, 24]


def test_request_log_records_an_abandoned_request_as_not_completed(sim_factory, tmp_path):
    log = tmp_path / "requests.jsonl"
    server = sim_factory("--request-log", str(log), kv_events=False)
    body = {"model": MODEL, "prompt": _long_text("lambda"), "max_tokens": 4000}
    with pytest.raises(httpx.ReadTimeout):  # the client gives up long before the answer
        httpx.post(
            server.url(0) + "/v1/completions",
            json=body,
            timeout=0.3,
            headers={"X-Request-Id": "gone-1"},
        )
    lines = wait_until(lambda: _log_lines(log, 1), 5, "the request in the request log")
    [record] = map(json.loads, lines)
    assert record["request_id"] == "cmpl-gone-1" and not record["stream"]
    assert not record["completed"] and record["output_tokens"] < 4000


def test_a_client_gone_before_its_body_arrived_is_no_server_error(sim_factory, capfd):
    """A router that gives up on a hung engine closes the connection with the body unsent;
    the engine drops that request quietly (no traceback) and goes on serving."""
    import socket
    from urllib.parse import urlsplit

    server = sim_factory()
    port = urlsplit(server.url(0)).port
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n" + b'{"model": "'
        )
    answer = httpx.post(
        server.url(0) + "/v1/completions",
        json={"model": MODEL, "prompt": "still serving", "max_tokens": 2},
        timeout=30,
    )
    assert answer.status_code == 200
    captured = capfd.readouterr()
    assert "Traceback" not in captured.err, captured.err
