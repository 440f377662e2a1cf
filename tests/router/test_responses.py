"""OpenAI's Responses API (``/v1/responses``) through a live router in front of enginesim:
the OpenAI SDK unchanged, streaming and not; the prompt rendered and tokenized as the
engine (vLLM) renders it, so its blocks hash alike; a ``previous_response_id`` chain of
ten turns kept on one instance by SMetric; errors in the OpenAI shape."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from chat_templates import load_chat_template
from engine_interface.agent_apis import messages_chat_body, responses_chat_body
from tests.fleets import fast_fleet
from tests.router.helpers import MODEL, router_config
from tests.router.test_chat_templates import engine_equivalent_tokenizer

INSTRUCTIONS = "You are a careful assistant. " + " ".join(f"rule{i}" for i in range(120))
RESPONSES_BODIES: list[dict[str, Any]] = [
    {"input": "Plain text input."},
    {"instructions": INSTRUCTIONS, "input": "With instructions."},
    {
        "instructions": "Be brief.",
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "Hello."}]},
            {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "42"},
            {"role": "user", "content": "And now?"},
        ],
        "tools": [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}],
    },
]
MESSAGES_BODIES: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "Plain."}]},
    {
        "system": [{"type": "text", "text": INSTRUCTIONS}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "t1", "name": "weather", "input": {"q": "Oslo"}},
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "rain"}],
            },
        ],
        "tools": [{"name": "weather", "input_schema": {"properties": {"q": {"type": "string"}}}}],
    },
]


def _client(router: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0)


def test_openai_sdk_responses_through_the_router_stream_and_not(fleet, router_factory):
    router = router_factory(router_config(fleet, "lmetric"))
    client = _client(router)
    raw = client.responses.with_raw_response.create(
        model=MODEL, instructions=INSTRUCTIONS, input="First question.", max_output_tokens=6
    )
    reply = raw.parse()
    assert raw.headers["x-switchyard-policy"] == "lmetric"
    assert reply.id.startswith("resp_") and reply.output_text
    assert reply.usage is not None and reply.usage.output_tokens == 6
    routed = router.state()["recent_decisions"][-1]
    assert routed["prompt_tokens"] > 0 and routed["status"] == 200

    events = list(
        client.responses.create(
            model=MODEL, instructions=INSTRUCTIONS, input="Second question.", stream=True
        )
    )
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert text and final.output_text == text and final.usage is not None
    # the shared instructions hash alike: the router predicted a cache hit, and the
    # engine it chose had one (counts differ: this router tokenizes approximately)
    routed = router.state()["recent_decisions"][-1]
    assert routed["cached_tokens"] > 0
    assert final.usage.input_tokens_details.cached_tokens > 0


def test_router_refuses_a_bad_responses_body_in_the_openai_shape(fleet, router_factory):
    router = router_factory(router_config(fleet, "round_robin"))
    bad: list[tuple[dict[str, Any], str]] = [
        ({"input": [{"type": "bogus"}]}, "input"),
        ({"input": "x", "previous_response_id": 7}, "previous_response_id"),
        ({"input": "x", "max_output_tokens": "many"}, "max_output_tokens"),
        ({}, "input"),
    ]
    for body, param in bad:
        answer = httpx.post(router.url + "/v1/responses", json={"model": MODEL, **body})
        assert answer.status_code == 400, body
        error = answer.json()["error"]
        assert error["param"] == param and error["type"] == "BadRequestError", body
    assert router.state()["recent_decisions"] == []  # refused before routing


def test_ten_turn_responses_chain_stays_on_one_instance_under_smetric(fleet, router_factory):
    """Each turn names only its previous response: the router learns the chain from the
    answers, takes the session from it and routes on the history's blocks. Without that,
    every turn looks like a first turn and SMetric spreads them (and vLLM, whose response
    store is per instance, would answer 404 elsewhere)."""
    router = router_factory(router_config(fleet, "smetric"))
    client = _client(router)
    previous: str | None = None
    instances, reasons = [], []
    for turn in range(10):
        words = " ".join(f"w{turn}x{i}" for i in range(40))
        common: dict[str, Any] = {
            "model": MODEL,
            "instructions": "Keep going.",
            "input": f"Turn {turn}: {words}",
            "max_output_tokens": 8,
            "previous_response_id": previous,
        }
        if turn % 2:  # streamed turns: the id comes from response.created
            streamed = client.responses.with_raw_response.create(stream=True, **common)
            headers = streamed.headers
            previous = list(streamed.parse())[-1].response.id
        else:
            whole = client.responses.with_raw_response.create(**common)
            headers = whole.headers
            previous = whole.parse().id
        instances.append(headers["x-switchyard-instance"])
        reasons.append(headers["x-switchyard-reason"])
    assert len(set(instances)) == 1, (instances, reasons)
    assert all(reason == "session_stick" for reason in reasons[1:]), reasons


@pytest.fixture(scope="module")
def exact_engine(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One engine and a tokenizer.json tokenizing as it does (the router's exact mode)."""
    template = load_chat_template("chatml")
    texts = [template.render_request(responses_chat_body(b)) for b in RESPONSES_BODIES]
    texts += [template.render_request(messages_chat_body(b)) for b in MESSAGES_BODIES]
    path = tmp_path_factory.mktemp("agent-tokenizer") / "tokenizer.json"
    with fast_fleet(1) as engine:
        yield engine, engine_equivalent_tokenizer(Path(path), texts)


@pytest.mark.parametrize(
    ("path", "bodies", "extra"),
    [
        ("/v1/responses", RESPONSES_BODIES, {"max_output_tokens": 2}),
        ("/v1/messages", MESSAGES_BODIES, {"max_tokens": 2}),
    ],
)
def test_router_tokenizes_as_the_engine(exact_engine, router_factory, path, bodies, extra):
    engine, tokenizer_path = exact_engine
    document: dict[str, Any] = {
        "cluster": "agent",
        "model": MODEL,
        "instances": [{"name": "i0", "url": engine.url(0)}],
        "policy": {"kind": "round_robin", "params": {}},
        "router": {"kv_events": False, "tokenizer_path": tokenizer_path},
    }
    router = router_factory(document)
    for body in bodies:
        sent = {"model": MODEL, **extra, **body}
        answer = httpx.post(router.url + path, json=sent, timeout=30)
        assert answer.status_code == 200, answer.text
        routed = router.state()["recent_decisions"][-1]
        assert routed["tier"] == "exact"
        assert routed["prompt_tokens"] == answer.json()["usage"]["input_tokens"], body


def test_responses_chains_stay_in_their_canary_arm(fleet, router_factory):
    """A chain's first turn has no session (its arm is drawn at random), its next turns
    have one (the chain's): they stay in the first turn's arm, whose instances hold the
    history, instead of the arm their session would hash to."""
    names = [i["name"] for i in fleet.instances()]
    smetric = {"kind": "smetric", "params": {}}
    canary = {
        "arms": [
            {"name": "a", "policy": smetric, "weight": 50, "instances": names[:2]},
            {"name": "b", "policy": smetric, "weight": 50, "instances": names[2:]},
        ],
        "salt": "chains",
    }
    router = router_factory(router_config(fleet, "smetric", canary=canary))
    client = _client(router)
    for chain in range(6):
        previous, arms, instances = None, set(), set()
        for turn in range(3):
            raw = client.responses.with_raw_response.create(
                model=MODEL,
                input=f"chain {chain} turn {turn}",
                max_output_tokens=3,
                previous_response_id=previous,
            )
            arms.add(raw.headers["x-switchyard-arm"])
            instances.add(raw.headers["x-switchyard-instance"])
            previous = raw.parse().id
        assert len(arms) == 1 and len(instances) == 1, (chain, arms, instances)


@pytest.mark.parametrize("kind", ["round_robin", "lmetric"])
def test_a_chained_turn_goes_to_the_instance_holding_its_chain_under_any_policy(
    fleet, router_factory, kind
):
    """vLLM keeps a response's history on the instance that answered it: a round robin
    (or a load score) sending the next turn elsewhere would get vLLM's 404."""
    router = router_factory(router_config(fleet, kind))
    client = _client(router)
    previous, instances = None, []
    for turn in range(5):
        raw = client.responses.with_raw_response.create(
            model=MODEL, input=f"turn {turn}", max_output_tokens=3, previous_response_id=previous
        )
        instances.append(raw.headers["x-switchyard-instance"])
        previous = raw.parse().id
    assert len(set(instances)) == 1, instances
    # a new conversation is the policy's to place as it likes
    fresh = client.responses.with_raw_response.create(model=MODEL, input="new", max_output_tokens=3)
    assert fresh.status_code == 200
