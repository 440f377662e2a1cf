"""Mid-stream continuation against real enginesim instances: an answer an instance breaks
off after its first byte is continued on another, and the client sees one answer.

"One answer" is checked against the engines themselves: enginesim's text is a function of
the prompt, so the spliced answer must be exactly the broken instance's first ``k`` tokens
followed by what an engine answers to the continuation's own request (the prompt, or the
messages, with those ``k`` tokens of text), asked directly, with ``max_tokens - k``."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from tests.router.helpers import MODEL, router_config, scrape_total

URL_COMPLETIONS = "/v1/completions"
URL_CHAT = "/v1/chat/completions"


def _events(text: str) -> list[str]:
    return [line[6:] for line in text.splitlines() if line.startswith("data: ")]


def _content(event: dict[str, Any], chat: bool) -> str:
    choice = (event.get("choices") or [{}])[0]
    return (choice.get("delta") or {}).get("content") or "" if chat else choice.get("text") or ""


def _answer(raw: str, chat: bool) -> tuple[list[str], dict[str, Any], set[str], list[str]]:
    """(content pieces, usage, ids, raw events) of a streamed answer."""
    events = _events(raw)
    parsed = [json.loads(e) for e in events if e != "[DONE]"]
    pieces = [_content(e, chat) for e in parsed if _content(e, chat)]
    usage: dict[str, Any] = next((e["usage"] for e in parsed if e.get("usage")), {})
    return pieces, usage, {e["id"] for e in parsed if "id" in e}, events


def _direct(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """An engine's whole answer to ``body``, asked directly (no router)."""
    whole = {k: v for k, v in body.items() if k != "stream_options"} | {"stream": False}
    response = httpx.post(url + path, json=whole, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def _direct_text(url: str, path: str, body: dict[str, Any], chat: bool) -> str:
    choice = _direct(url, path, body)["choices"][0]
    return choice["message"]["content"] if chat else choice["text"]


def _stream(router_url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    response = httpx.post(router_url + path, json=body | {"stream": True}, timeout=60)
    assert response.status_code == 200
    return response


def _completion(tag: str, max_tokens: int) -> dict[str, Any]:
    prompt = " ".join(f"{tag}{i}" for i in range(60))
    return {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream_options": {"include_usage": True},
    }


def _chat(tag: str, max_tokens: int) -> dict[str, Any]:
    messages = [{"role": "user", "content": " ".join(f"{tag}{i}" for i in range(60))}]
    return {
        "model": MODEL,
        "messages": messages,
        "max_tokens": max_tokens,
        "stream_options": {"include_usage": True},
    }


def _continued_body(body: dict[str, Any], chat: bool, text: str, sent: int) -> dict[str, Any]:
    """The continuation's request as vLLM's API defines it, written out independently of
    the router's code."""
    rest = body["max_tokens"] - sent
    if chat:
        partial = {"role": "assistant", "content": text}
        return body | {
            "messages": [*body["messages"], partial],
            "add_generation_prompt": False,
            "continue_final_message": True,
            "max_tokens": rest,
        }
    return body | {"prompt": body["prompt"] + text, "max_tokens": rest}


@pytest.fixture
def pair(fleet):
    """A router in front of i2 and i3 (round robin), i2 breaking streams after 6 events."""
    yield fleet.instances()[2:4]
    fleet.fault(2, "recover")


@pytest.mark.parametrize(("path", "chat"), [(URL_COMPLETIONS, False), (URL_CHAT, True)])
@pytest.mark.parametrize("fault", ["drop_midstream", "garbage"])
def test_broken_stream_is_continued_as_one_answer(fleet, router_factory, pair, path, chat, fault):
    router = router_factory(router_config(fleet, "round_robin", instances=pair))
    after = 6  # events the broken instance sends (chat: the role event, then 5 tokens)
    sent = after - 1 if chat else after
    fleet.fault(2, fault, after_chunks=after)
    total = 24
    body = (_chat if chat else _completion)(f"cont-{fault}-", total)
    answers = [_stream(router.url, path, body | {"user": f"u{k}"}) for k in range(2)]
    broken = [a for a in answers if a.headers["x-switchyard-instance"] == "i2"]
    retried = [a for a in answers if a.headers["x-switchyard-reason"] == "retry"]
    assert len(broken) + len(retried) == 1  # round robin: one of the two went to i2
    for answer in answers:
        pieces, usage, ids, events = _answer(answer.text, chat)
        assert not any('"error"' in e for e in events), events
        assert events.count("[DONE]") == 1 and events[-1] == "[DONE]"
        assert len(ids) == 1  # one request id
        assert sum('"role":"assistant"' in e for e in events) == (1 if chat else 0)
        assert len(pieces) == total
        assert usage["completion_tokens"] == total
        assert usage["total_tokens"] == usage["prompt_tokens"] + total
    continued = scrape_total(router.url, "switchyard_router_continuations_total")
    if retried:
        # The garbage came in the same read as i2's first events: nothing had reached the
        # client, and the retry rule served the request whole elsewhere.
        assert fault == "garbage" and continued == 0
        return
    # The spliced answer: i2's first tokens (all it sent, unless garbage shared a read
    # with the last of them), then exactly what an engine continues with.
    pieces, usage, _, _ = _answer(broken[0].text, chat)
    engine = fleet.url(3)
    k = _splice_point(engine, path, body, chat, pieces)
    assert k is not None
    assert usage["prompt_tokens"] == _direct(engine, path, body)["usage"]["prompt_tokens"]
    assert continued == 1
    if fault == "garbage" and k == total:
        # The garbage came in the same read as every token i2 sent: the client had only
        # chat's role event, and the continuation of the empty text is the answer whole.
        assert chat
        return
    assert k == sent if fault == "drop_midstream" else 0 < k <= sent
    # The continuation was routed on what it re-sent: the prompt and the text sent.
    decisions = router.state()["recent_decisions"]
    continuation = [d["prompt_tokens"] for d in decisions if d["reason"] == "continuation"]
    first = [d["prompt_tokens"] for d in decisions if d["reason"] != "continuation"]
    assert len(continuation) == len(first) == 1 and continuation[0] > first[0]


def test_request_that_cannot_be_continued_fails_with_the_reason(fleet, router_factory, pair):
    router = router_factory(router_config(fleet, "round_robin", instances=pair))
    fleet.fault(2, "drop_midstream", after_chunks=3)
    body = _completion("echo", 20) | {"echo": True}
    answers = [_stream(router.url, URL_COMPLETIONS, body) for _ in range(2)]
    broken = [a for a in answers if a.headers["x-switchyard-instance"] == "i2"]
    events = _events(broken[0].text)
    assert events[-1] == "[DONE]"
    message = json.loads(events[-2])["error"]["message"]
    assert message.endswith(
        ": RemoteProtocolError; not continued: echo (the prompt is part of the answer)"
    )
    assert scrape_total(router.url, "switchyard_router_continuations_total") == 0


def test_continuations_stop_at_the_limit(fleet, router_factory, pair):
    document = router_config(fleet, "round_robin", instances=pair)
    document["router"] |= {"max_continuations": 1, "breaker_failures": 100}
    router = router_factory(document)
    fleet.fault(2, "drop_midstream", after_chunks=3)
    fleet.fault(3, "drop_midstream", after_chunks=3)
    try:
        answer = _stream(router.url, URL_COMPLETIONS, _completion("limit", 20))
    finally:
        fleet.fault(3, "recover")
    pieces, _, ids, _ = _answer(answer.text, False)
    # Three tokens from each instance, one continuation, then the error event and [DONE].
    assert len(pieces) == 6 and len(ids) == 1
    error = json.loads(_events(answer.text)[-2])["error"]
    assert "not continued: 1 continuations made" in error["message"]
    assert scrape_total(router.url, "switchyard_router_continuations_total") == 1


def test_without_continuations_a_broken_stream_ends_with_an_error(fleet, router_factory, pair):
    document = router_config(fleet, "round_robin", instances=pair)
    document["router"]["max_continuations"] = 0
    router = router_factory(document)
    fleet.fault(2, "drop_midstream", after_chunks=3)
    answers = [_stream(router.url, URL_COMPLETIONS, _completion(f"off{k}", 20)) for k in range(2)]
    broken = [a for a in answers if a.headers["x-switchyard-instance"] == "i2"]
    events = _events(broken[0].text)
    assert events[-1] == "[DONE]" and "failed mid-stream" in events[-2]
    assert "not continued" not in events[-2]


def test_streams_on_a_killed_instance_are_continued(fleet, router_factory):
    """Streams running on an instance that dies are all finished elsewhere, each one the
    dead instance's tokens followed by an engine's continuation of them."""
    router = router_factory(router_config(fleet, "round_robin"))
    total, count = 400, 24
    bodies = [_completion(f"kill{k}-", total) for k in range(count)]

    async def scenario() -> list[tuple[httpx.Headers, str]]:
        started = asyncio.Semaphore(0)

        async def one(client: httpx.AsyncClient, body: dict[str, Any]) -> tuple[Any, str]:
            url = router.url + URL_COMPLETIONS
            async with client.stream("POST", url, json=body | {"stream": True}) as response:
                assert response.status_code == 200
                chunks = response.aiter_text()
                parts = [await anext(chunks)]
                started.release()  # tokens are flowing: the kill will cut this stream
                parts += [part async for part in chunks]
                return response.headers, "".join(parts)

        async with httpx.AsyncClient(timeout=60) as client:
            load = [asyncio.create_task(one(client, b)) for b in bodies]
            for _ in bodies:
                await started.acquire()
            await asyncio.to_thread(fleet.fault, 1, "kill")
            return await asyncio.gather(*load)

    # i1 runs slow (at this fleet's time scale a stream takes a fraction of a second):
    # its streams are still going when it dies. At 20× a loaded machine took long enough
    # between the first tokens of all 24 streams and the kill for two of i1's to finish.
    fleet.fault(1, "slow", factor=200)
    try:
        answers = asyncio.run(scenario())
    finally:
        fleet.fault(1, "recover")
    continued = 0
    for body, (headers, text) in zip(bodies, answers, strict=True):
        pieces, usage, ids, events = _answer(text, False)
        assert not any('"error"' in e for e in events), events
        assert len(pieces) == total and usage["completion_tokens"] == total and len(ids) == 1
        if "".join(pieces) == _direct_text(fleet.url(0), URL_COMPLETIONS, body, False):
            continue
        continued += 1
        assert headers["x-switchyard-instance"] == "i1"
        assert _splice_point(fleet.url(0), URL_COMPLETIONS, body, False, pieces)
    assert continued == count // 4  # round robin: every stream on i1
    assert scrape_total(router.url, "switchyard_router_continuations_total") == continued


def _splice_point(
    engine: str, path: str, body: dict[str, Any], chat: bool, pieces: list[str]
) -> int | None:
    """The k such that the answer is the uncut answer's first k tokens and then the
    engine's continuation of them (None: no such k). The candidates: where the two part,
    or up to two tokens before (a continuation may happen to begin with the words the
    uncut answer had next)."""
    whole = _direct_text(engine, path, body, chat)
    agree = 0
    while agree < len(pieces) and whole.startswith("".join(pieces[: agree + 1])):
        agree += 1
    if agree == len(pieces):
        return agree  # the uncut answer itself: nothing was spliced
    for k in range(agree, max(0, agree - 3), -1):
        head = "".join(pieces[:k])
        rest = _direct_text(engine, path, _continued_body(body, chat, head, k), chat)
        if "".join(pieces[k:]) == rest:
            return k
    return None


def _whole(router_url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    """A non-streamed request through the router."""
    whole = {k: v for k, v in body.items() if k != "stream_options"}
    response = httpx.post(router_url + path, json=whole, timeout=60)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    return response


def _whole_text(answer: dict[str, Any], chat: bool) -> str:
    choice = answer["choices"][0]
    return choice["message"]["content"] if chat else choice["text"]


@pytest.mark.parametrize(("path", "chat"), [(URL_COMPLETIONS, False), (URL_CHAT, True)])
def test_healthy_whole_answer_is_the_engines_own(fleet, router_factory, path, chat):
    """A non-streamed request goes upstream as a stream (so that it could be continued);
    the client's body is the one the engine answers a non-streamed request with: the same
    keys and values, the id and the time aside."""
    router = router_factory(router_config(fleet, "round_robin", instances=fleet.instances()[3:]))
    body = (_chat if chat else _completion)("healthy-whole-", 24)
    _direct(fleet.url(3), path, body)  # the prompt cached: both answers below count it alike
    answer = _whole(router.url, path, body).json()
    direct = _direct(fleet.url(3), path, body)
    assert answer["id"] != direct["id"]  # the router asked the engine again, as a stream
    for key in ("id", "created"):
        answer.pop(key), direct.pop(key)
    assert answer == direct
    assert json.dumps(answer, sort_keys=False) == json.dumps(direct, sort_keys=False)  # order


@pytest.mark.parametrize(("path", "chat"), [(URL_COMPLETIONS, False), (URL_CHAT, True)])
def test_whole_answer_broken_off_is_continued(fleet, router_factory, pair, path, chat):
    """A non-streamed request whose instance breaks off its generation is continued on
    another like a stream; the client gets one body: the broken instance's tokens then an
    engine's continuation of them, every token once, usage adding up, one id."""
    router = router_factory(router_config(fleet, "round_robin", instances=pair))
    after = 7  # events the broken instance sends (chat: the role event, then 6 tokens)
    sent = after - 1 if chat else after
    fleet.fault(2, "drop_midstream", after_chunks=after)
    total = 24
    body = (_chat if chat else _completion)("whole-cut-", total)
    answers = [_whole(router.url, path, body | {"user": f"w{k}"}) for k in range(2)]
    # The head goes with the whole body: it names the instance that finished the answer.
    broken = [a for a in answers if a.headers["x-switchyard-reason"] == "continuation"]
    assert len(broken) == 1 and broken[0].headers["x-switchyard-instance"] == "i3"
    engine = fleet.url(3)
    direct = _direct(engine, path, body)
    for answer in answers:
        parsed = answer.json()
        usage = parsed["usage"]
        assert usage["completion_tokens"] == total
        assert usage["prompt_tokens"] == direct["usage"]["prompt_tokens"]
        assert usage["total_tokens"] == usage["prompt_tokens"] + total
        assert parsed["choices"][0]["finish_reason"] == "length"
        assert parsed.keys() == direct.keys()
    text = _whole_text(broken[0].json(), chat)
    assert text != _whole_text(direct, chat)  # i2's tokens, then another prompt's answer
    head = _direct_text(engine, path, body | {"max_tokens": sent}, chat)
    assert text.startswith(head)
    rest = _direct_text(engine, path, _continued_body(body, chat, head, sent), chat)
    assert text == head + rest
    assert scrape_total(router.url, "switchyard_router_continuations_total") == 1


def test_whole_answer_that_cannot_be_continued_is_served_again(fleet, router_factory, pair):
    """A non-streamed request that cannot be continued (here ``echo``) is asked of the
    engine as it is: its answer reaches the router whole or not at all, and one broken off
    was never seen by the client, so it is sent again (the retry rule)."""
    router = router_factory(router_config(fleet, "round_robin", instances=pair))
    fleet.fault(2, "drop_midstream")
    body = _completion("whole", 24) | {"echo": True}
    del body["stream_options"]
    answers = [httpx.post(router.url + URL_COMPLETIONS, json=body, timeout=60) for _ in range(2)]
    assert [a.status_code for a in answers] == [200, 200]
    expected = _direct_text(fleet.url(3), URL_COMPLETIONS, body, False)
    assert [a.json()["choices"][0]["text"] for a in answers] == [expected, expected]
    assert "retry" in {a.headers["x-switchyard-reason"] for a in answers}
    assert scrape_total(router.url, "switchyard_router_continuations_total") == 0


def test_whole_answer_past_the_limit_fails_with_the_reason(fleet, router_factory, pair):
    """Both instances break the answer off and one continuation is allowed: the client
    gets one error answer (not a partial body) that says why it was not continued."""
    document = router_config(fleet, "round_robin", instances=pair)
    document["router"] |= {"max_continuations": 1, "breaker_failures": 100}
    router = router_factory(document)
    fleet.fault(2, "drop_midstream", after_chunks=3)
    fleet.fault(3, "drop_midstream", after_chunks=3)
    body = _completion("whole-limit", 20)
    del body["stream_options"]
    try:
        answer = httpx.post(router.url + URL_COMPLETIONS, json=body, timeout=60)
    finally:
        fleet.fault(3, "recover")
    assert answer.status_code == 502
    assert "not continued: 1 continuations made" in answer.json()["error"]["message"]
    assert scrape_total(router.url, "switchyard_router_continuations_total") == 1


def test_assembled_answer_over_the_size_limit_is_a_clear_502(fleet, router_factory):
    """An answer kept to be assembled is held to ``max_response_bytes`` as a whole one is:
    the request asked for it (no continuation, no retry, no strike)."""
    document = router_config(fleet, "round_robin", instances=fleet.instances()[3:])
    document["router"]["max_response_bytes"] = 4096
    router = router_factory(document)
    body = _completion("whole-large", 200)
    del body["stream_options"]
    answer = httpx.post(router.url + URL_COMPLETIONS, json=body, timeout=60)
    assert answer.status_code == 502
    assert "max_response_bytes" in answer.json()["error"]["message"]
    limit = "switchyard_router_limit_hits_total"
    assert scrape_total(router.url, limit, limit="response_too_large") == 1
    assert scrape_total(router.url, "switchyard_router_continuations_total") == 0
    small = _whole(router.url, URL_COMPLETIONS, _completion("whole-small", 4)).json()
    assert small["usage"]["completion_tokens"] == 4  # the instance still serves
