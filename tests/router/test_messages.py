"""Anthropic's Messages API (``/v1/messages``) through a live router in front of enginesim:
the Anthropic SDK unchanged, streaming and not, and errors in Anthropic's shape, the
router's own as the engine's (the router's tokenization of Messages bodies is checked
against the engine's in test_responses.py)."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import pytest

from tests.router.helpers import MODEL, router_config


def _claude(router: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=router.url, api_key="unused", max_retries=0)


def test_anthropic_sdk_through_the_router_stream_and_not(fleet, router_factory):
    router = router_factory(router_config(fleet, "lmetric"))
    claude = _claude(router)
    system = "You answer questions. " + " ".join(f"fact{i}" for i in range(150))
    raw = claude.messages.with_raw_response.create(
        model=MODEL,
        max_tokens=5,
        system=system,
        messages=[{"role": "user", "content": "What is two plus two?"}],
        metadata={"user_id": "alice"},
    )
    reply = raw.parse()
    assert raw.headers["x-switchyard-policy"] == "lmetric"
    assert reply.type == "message" and reply.stop_reason == "max_tokens"
    assert reply.content and reply.usage.output_tokens == 5

    with claude.messages.stream(
        model=MODEL,
        max_tokens=9,
        system=system,
        messages=[{"role": "user", "content": "And three plus three?"}],
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.content[0].text == text  # type: ignore[union-attr]
    assert final.usage.output_tokens == 9
    # the shared system prompt hashes alike: the router predicted a cache hit for it
    routed = router.state()["recent_decisions"][-1]
    assert routed["status"] == 200 and routed["cached_tokens"] > 0


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, 400, "max_tokens"),  # router
        ({"max_tokens": 4, "messages": [{"role": "robot", "content": "hi"}]}, 400, "role"),
        ({"max_tokens": 4, "messages": "hi"}, 400, "messages"),
        ({"max_tokens": 0, "messages": [{"role": "user", "content": "hi"}]}, 400, "max_tokens"),
    ],
)
def test_errors_in_anthropics_shape(fleet, router_factory, body, status, fragment):
    router = router_factory(router_config(fleet, "round_robin"))
    answer = httpx.post(router.url + "/v1/messages", json={"model": MODEL, **body}, timeout=30)
    assert answer.status_code == status
    error = answer.json()
    assert error["type"] == "error" and set(error["error"]) == {"type", "message"}
    assert fragment in error["error"]["message"]


def test_anthropic_sdk_raises_on_the_routers_errors(fleet, router_factory):
    router = router_factory(router_config(fleet, "round_robin"))
    with pytest.raises(anthropic.NotFoundError) as caught:
        _claude(router).messages.create(
            model="no-such-model", max_tokens=3, messages=[{"role": "user", "content": "hi"}]
        )
    assert "no-such-model" in str(caught.value)


def test_a_stream_cut_midway_ends_with_anthropics_error_event(fleet, router_factory):
    """The engine drops the stream after three events: the client's stream ends with an
    ``error`` event in Anthropic's shape (no ``[DONE]``: not an OpenAI stream), which the
    SDK raises."""
    router = router_factory(router_config(fleet, "round_robin", instances=fleet.instances()[3:4]))
    body = {
        "model": MODEL,
        "max_tokens": 40,
        "stream": True,
        "messages": [{"role": "user", "content": "A long story, please."}],
    }
    fleet.fault(3, "drop_midstream", after_chunks=3)
    try:
        raw = httpx.post(router.url + "/v1/messages", json=body, timeout=30)
        sdk = {k: v for k, v in body.items() if k != "stream"}
        with (
            pytest.raises(anthropic.APIStatusError) as caught,
            _claude(router).messages.stream(**sdk) as stream,  # type: ignore[arg-type]
        ):
            list(stream)
    finally:
        fleet.fault(3, "recover")
    assert raw.status_code == 200
    last = raw.text.rstrip("\n").split("\n\n")[-1]
    assert last.startswith("event: error\ndata: ") and "[DONE]" not in raw.text
    error = json.loads(last.split("data: ", 1)[1])
    assert error["type"] == "error" and error["error"]["type"] == "BadGatewayError"
    assert "mid-stream" in str(caught.value)
