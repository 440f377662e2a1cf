"""The openai SDK through a live router in front of an enginesim fleet; routing behaviour."""

from __future__ import annotations

from collections import Counter

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionSystemMessageParam

import engine_interface as ei
from devharness import wait_until
from tests.router.client_keys import DEBUG_KEY, debug_key_only
from tests.router.helpers import MODEL, router_config


@pytest.fixture
def lmetric_router(fleet, router_factory):
    document = router_config(fleet, "lmetric", client_auth=debug_key_only())
    # The scraped running count lags a finished request by up to one interval, and
    # LMetric's product makes any busy-looking instance lose to an idle one; scrape rarely
    # so these sequential requests see only the router's own (exact) accounting.
    document["router"]["scrape_interval_s"] = 30
    return router_factory(document)


def _client(router) -> openai.OpenAI:
    return openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0)


def _text(tag: str, words: int = 60) -> str:
    return " ".join(f"{tag}{i}" for i in range(words))


def test_openai_sdk_chat_and_completions_stream_and_not(lmetric_router):
    client = _client(lmetric_router)
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": _text("alpha")}]
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, max_tokens=5
    )
    reply = raw.parse()
    assert reply.usage is not None
    assert reply.choices[0].message.content and reply.usage.completion_tokens == 5
    assert raw.headers["x-switchyard-policy"] == "lmetric"
    assert raw.headers["x-switchyard-arm"] == "default"
    assert raw.headers["x-switchyard-instance"] in {"i0", "i1", "i2", "i3"}
    assert raw.headers["x-switchyard-reason"] == "score"

    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=7,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    usage = chunks[-1].usage
    assert len(content) == 7 and usage is not None and usage.completion_tokens == 7

    completion = client.completions.create(model=MODEL, prompt=_text("beta"), max_tokens=4)
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 4 and completion.choices[0].text
    pieces = [
        c.choices[0].text
        for c in client.completions.create(
            model=MODEL, prompt=[1, 2, 3, 4] * 10, max_tokens=6, stream=True
        )
    ]
    assert len([p for p in pieces if p]) == 6
    assert [m.id for m in client.models.list().data] == [MODEL]
    # The engines' context length is passed on, so clients can skip what cannot be served.
    card = httpx.get(lmetric_router.url + "/v1/models").json()["data"][0]
    assert card["max_model_len"] == 32768


def test_debug_header_returns_per_candidate_scores(lmetric_router):
    body = {"model": MODEL, "prompt": _text("gamma"), "max_tokens": 2}
    plain = httpx.post(lmetric_router.url + "/v1/completions", json=body, timeout=10)
    anonymous = httpx.post(
        lmetric_router.url + "/v1/completions",
        json=body,
        timeout=10,
        headers={"x-switchyard-debug": "1"},
    )
    debug = httpx.post(
        lmetric_router.url + "/v1/completions",
        json=body,
        timeout=10,
        headers={"x-switchyard-debug": "1", "Authorization": f"Bearer {DEBUG_KEY}"},
    )
    assert "x-switchyard-scores" not in plain.headers
    assert "x-switchyard-scores" not in anonymous.headers  # the debug right is the key's
    scores = httpx.Response(200, content=debug.headers["x-switchyard-scores"]).json()
    assert set(scores) == {"i0", "i1", "i2", "i3"}
    assert int(debug.headers["x-switchyard-cached-tokens"]) > 0  # same prompt again


def _prefix_hits(fleet, index: int) -> float:
    return fleet.metric(index, ei.PREFIX_HITS.total)


def test_prefix_sharing_requests_land_on_the_holder_under_lmetric(fleet, lmetric_router):
    client = _client(lmetric_router)
    system: ChatCompletionSystemMessageParam = {
        "role": "system",
        "content": _text("shared-doc", 300),
    }
    homes = Counter[str]()
    for turn in range(8):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL,
            max_tokens=2,
            messages=[system, {"role": "user", "content": f"question {turn}"}],
        )
        homes[raw.headers["x-switchyard-instance"]] += 1
    # Sequential requests leave no load behind: the holder of the prefix always wins.
    assert len(homes) == 1, homes
    holder = next(iter(homes))
    other = client.chat.completions.with_raw_response.create(
        model=MODEL,
        max_tokens=2,
        messages=[{"role": "user", "content": _text("fresh", 300)}],
        extra_headers={"x-switchyard-debug": "1", "Authorization": f"Bearer {DEBUG_KEY}"},
    )
    assert int(other.headers["x-switchyard-cached-tokens"]) == 0
    # The engine agrees that the shared prefix was cached: the next request behind it goes
    # to the holder, whose engine counts the prefix as a hit (its own prefix-cache counter,
    # and the cached tokens of its answer); no other engine sees a hit. (The router's own
    # prediction counts its approximate tokens, so it is near the engine's, not equal.)
    hits_before = [_prefix_hits(fleet, k) for k in range(4)]
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        max_tokens=2,
        messages=[system, {"role": "user", "content": "again"}],
        extra_headers={"x-switchyard-debug": "1", "Authorization": f"Bearer {DEBUG_KEY}"},
    )
    assert raw.headers["x-switchyard-instance"] == holder
    predicted = int(raw.headers["x-switchyard-cached-tokens"])
    last = raw.parse()
    assert last.usage is not None and last.usage.prompt_tokens_details is not None
    cached = last.usage.prompt_tokens_details.cached_tokens
    assert cached is not None and cached >= 300 and predicted >= 300
    hits = [_prefix_hits(fleet, k) - hits_before[k] for k in range(4)]
    assert hits == [cached if f"i{k}" == holder else 0 for k in range(4)]


def test_round_robin_spreads_load(fleet, router_factory):
    router = router_factory(router_config(fleet, "round_robin"))
    client = _client(router)
    seen = Counter[str]()
    for _ in range(12):
        raw = client.completions.with_raw_response.create(
            model=MODEL, prompt=_text("same", 100), max_tokens=1
        )
        assert raw.headers["x-switchyard-policy"] == "round_robin"
        seen[raw.headers["x-switchyard-instance"]] += 1
    assert seen == {"i0": 3, "i1": 3, "i2": 3, "i3": 3}


def test_preble_stops_charging_decode_once_the_router_saw_the_finish(fleet, router_factory):
    """The live router reports each finished request to the policy (``observe_finish``):
    Preble charges decode only to requests in flight, so once the first has finished its
    instance carries its windowed prefill and no decode."""
    router = router_factory(router_config(fleet, "preble", client_auth=debug_key_only()))
    client = _client(router)
    first = client.completions.with_raw_response.create(
        model=MODEL, prompt=list(range(1000, 1100)), max_tokens=50
    )
    usage = first.parse().usage
    assert usage is not None and usage.completion_tokens == 50
    wait_until(lambda: router.state()["recent_decisions"], 10, "the first request's finish")
    second = client.completions.with_raw_response.create(
        model=MODEL,
        prompt=list(range(5000, 5100)),
        max_tokens=1,
        extra_headers={"x-switchyard-debug": "1", "Authorization": f"Bearer {DEBUG_KEY}"},
    )
    scores = httpx.Response(200, content=second.headers["x-switchyard-scores"]).json()
    served = first.headers["x-switchyard-instance"]
    # 100 uncached prompt tokens of the first (in the window) + 100 new tokens
    assert scores[served] == pytest.approx(100 + 100)
    assert {v for k, v in scores.items() if k != served} == {100}


def test_admin_state_shows_each_recent_decision_with_its_details(fleet, router_factory):
    """An operator reading ``/admin/state`` sees why each request went where it did:
    predicted_ttft's prediction for the chosen instance rides on the decision, beside the
    TTFT the router then measured (a stream's first token)."""
    router = router_factory(router_config(fleet, "predicted_ttft"))
    client = _client(router)
    stream = client.completions.create(
        model=MODEL, prompt=list(range(2000, 2400)), max_tokens=2, stream=True
    )
    assert [chunk for chunk in stream]
    wait_until(lambda: router.state()["recent_decisions"], 10, "the request's finish")
    decision = router.state()["recent_decisions"][-1]
    assert decision["policy"] == "predicted_ttft"
    assert decision["details"]["predicted_ttft_s"] > 0
    assert decision["ttft_s"] > 0
