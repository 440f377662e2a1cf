"""A disaggregated cluster behind a real router: the router runs the prefill call and the
decode call itself (vLLM's NIXL flow against enginesim), relays the decode answer as one
response, retries a failed prefill elsewhere and falls back to colocated when the decode
stage fails before its first byte."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

import engine_interface as ei
from devharness import Fleet, wait_until
from enginesim.engine import MODELS
from tests.router.client_keys import DEBUG_KEY, debug_key_only
from tests.router.helpers import MODEL, router_config, scrape_total

KV_BYTES_PER_TOKEN = MODELS["qwen2-7b"].kv_bytes_per_token()
ROLES = {"i0": "prefill", "i1": "decode", "i2": "decode", "i3": "both"}
PREFILL_POOL, DECODE_POOL = {"i0", "i3"}, {"i1", "i2", "i3"}
HEADERS = {"Authorization": f"Bearer {DEBUG_KEY}"}


@pytest.fixture(scope="module")
def pd() -> Iterator[Fleet]:
    from tests.fleets import fast_fleet

    # Holds never read (a split whose decode stage failed) expire after 40 simulated s.
    extra = ["--roles", "prefill@0,decode@1-2", "--kv-hold-timeout", "40"]
    with fast_fleet(4, kv_events=True, kv_encoding="array", extra=extra) as fleet:
        yield fleet


@pytest.fixture
def recover(pd):
    yield
    pd.recover()


def disagg_config(fleet: Fleet, decider: str) -> dict:
    document = router_config(fleet, "lmetric", client_auth=debug_key_only())
    for spec in document["instances"]:
        spec["role"] = ROLES[spec["name"]]
    document["disaggregation"] = {"decider": {"kind": decider}}
    return document


def completion(url: str, tag: str, max_tokens: int = 12, **extra) -> httpx.Response:
    prompt = " ".join(f"{tag}{i}" for i in range(300))
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, **extra}
    return httpx.post(url + "/v1/completions", json=body, headers=HEADERS, timeout=60)


def moved_bytes(fleet: Fleet) -> float:
    return sum(fleet.metric(k, ei.NIXL_BYTES.name + "_sum") for k in range(fleet.size))


def held(fleet: Fleet) -> float:
    return sum(fleet.metric(k, ei.KV_HELD_REQUESTS.name) for k in range(fleet.size))


def test_a_split_request_is_prefilled_then_decoded_with_the_read_kv(pd, router_factory):
    router = router_factory(disagg_config(pd, "always"))
    before = moved_bytes(pd)
    reply = completion(router.url, "split")
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-switchyard-stage"] == "decode"
    assert reply.headers["x-switchyard-reason"] == "decode"
    assert reply.headers["x-switchyard-prefill-instance"] in PREFILL_POOL
    assert reply.headers["x-switchyard-instance"] in DECODE_POOL
    usage = reply.json()["usage"]
    assert usage["completion_tokens"] == 12
    # The decode instance computed only the last prompt token: the rest it read.
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1
    expected = (usage["prompt_tokens"] - 1) * KV_BYTES_PER_TOKEN
    if reply.headers["x-switchyard-prefill-instance"] == reply.headers["x-switchyard-instance"]:
        expected = 0  # i3 prefilled and decodes: its own blocks are a local hit
    wait_until(lambda: moved_bytes(pd) - before == expected, 10, "the read counted")
    wait_until(lambda: held(pd) == 0, 10, "the prefill's blocks released")


def test_the_openai_sdk_is_served_unchanged_streaming_and_not(pd, router_factory):
    router = router_factory(disagg_config(pd, "always"))
    client = openai.OpenAI(
        base_url=router.url + "/v1", api_key=DEBUG_KEY, max_retries=0, timeout=60
    )
    messages: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "route both halves of me " * 30}
    ]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=9)
    assert whole.usage is not None and whole.usage.completion_tokens == 9
    assert whole.choices[0].message.content
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=11,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content) == 11  # every token once: the prefill's token is never relayed
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 11


def test_never_keeps_requests_colocated_on_the_decode_pool(pd, router_factory):
    router = router_factory(disagg_config(pd, "never"))
    before = moved_bytes(pd)
    for k in range(6):
        reply = completion(router.url, f"never{k}-")
        assert reply.status_code == 200
        assert reply.headers["x-switchyard-stage"] == "whole"
        assert reply.headers["x-switchyard-instance"] in DECODE_POOL
        assert "x-switchyard-prefill-instance" not in reply.headers
    assert moved_bytes(pd) == before
    name = "switchyard_router_disaggregated_requests_total"
    assert scrape_total(router.url, name, stage="whole") == 6
    assert scrape_total(router.url, name, stage="decode") == 0


def test_a_failed_prefill_is_retried_on_another_prefill_instance(pd, router_factory, recover):
    router = router_factory(disagg_config(pd, "always"))
    pd.fault(0, "error5xx")
    for k in range(4):
        reply = completion(router.url, f"retry{k}-")
        assert reply.status_code == 200, reply.text
        assert reply.headers["x-switchyard-prefill-instance"] == "i3"
        assert reply.headers["x-switchyard-stage"] == "decode"
        assert reply.json()["usage"]["completion_tokens"] == 12


def test_a_decode_stage_failing_before_its_first_byte_falls_back_colocated(
    pd, router_factory, recover
):
    router = router_factory(disagg_config(pd, "always"))
    for index in (1, 2, 3):  # the whole decode pool answers 500
        pd.fault(index, "error5xx")
    for k in range(3):
        reply = completion(router.url, f"fallback{k}-", stream=True)
        assert reply.status_code == 200, reply.text
        assert reply.headers["x-switchyard-stage"] == "fallback"
        assert reply.headers["x-switchyard-instance"] == "i0"  # colocated where it can run
        text = reply.text
        assert text.count('"text":"') - text.count('"text":""') == 12  # nothing doubled
        assert text.rstrip().endswith("data: [DONE]")
    name = "switchyard_router_disaggregated_requests_total"
    assert scrape_total(router.url, name, stage="fallback") == 3

    # A split that reached its decode stage left its prefill's blocks held (vLLM has no
    # call to free them): their timeout frees them. (Once the health checks mark the decode
    # pool down, requests are no longer split at all.)
    # (i3, faulted too, failed its prefills: only i0 prefilled.)
    def held_on_i0() -> float:
        return pd.metric(0, ei.KV_HELD_REQUESTS.name)

    assert held_on_i0() <= 3  # at most one per request
    wait_until(lambda: held_on_i0() == 0, 30, "the failed split's hold expired")


def test_a_request_the_engine_refuses_gets_the_engines_4xx(pd, router_factory):
    router = router_factory(disagg_config(pd, "always"))
    reply = completion(router.url, "huge", max_tokens=40_000)
    assert reply.status_code == 400
    assert "maximum context length" in reply.json()["error"]["message"]


def test_a_client_may_not_set_kv_transfer_params(pd, router_factory):
    router = router_factory(disagg_config(pd, "never"))

    def held() -> float:  # the fleet is shared: earlier tests' holds may still run
        return sum(pd.metric(k, ei.KV_HELD_REQUESTS.name) for k in range(pd.size))

    before = held()
    params = {"do_remote_decode": True}
    reply = completion(router.url, "sneaky", kv_transfer_params=params)
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "kv_transfer_params"
    assert held() <= before  # nothing held for the refused request


def test_a_disaggregation_block_makes_a_cluster_of_both_instances_disaggregated(pd):
    from router_worker.contract.config import parse_config

    document = router_config(pd, "lmetric")
    config = parse_config(document)
    assert not config.disaggregated
    # The router's saved last good config reads back the same (a round trip adds no block).
    assert not parse_config(config.model_dump(mode="json")).disaggregated
    document["disaggregation"] = {"decider": {"kind": "cost"}}
    assert parse_config(document).disaggregated


def test_a_disaggregated_config_without_a_decode_pool_is_refused(pd):
    from router_worker.contract.config import ConfigError, parse_config

    document = disagg_config(pd, "always")
    for spec in document["instances"]:
        spec["role"] = "prefill"
    with pytest.raises(ConfigError, match="needs a decode pool"):
        parse_config(document)


def test_each_canary_arm_decodes_with_its_own_decode_policy(pd, router_factory):
    """A canary of the decode stage: the candidate arm's decode_policy (round robin), the
    baseline's the cluster's (decode_room); each session keeps its arm, and so its policy."""
    from router_worker.arms import arm_salt, session_point

    document = disagg_config(pd, "always")
    arm = {"policy": {"kind": "lmetric"}, "weight": 50}
    document["canary"] = {
        "salt": "decode canary",
        "arms": [
            {**arm, "name": "baseline", "instances": ["i0", "i1"]},
            {
                **arm,
                "name": "candidate",
                "instances": ["i3", "i2"],
                "decode_policy": {"kind": "round_robin"},
            },
        ],
    }
    router = router_factory(document)
    salt = arm_salt("decode canary")
    sessions = [f"s{k}" for k in range(40)]
    arm_of = {
        s: "baseline" if session_point(f"hdr:{s}", salt) < 50 else "candidate" for s in sessions
    }
    chosen = [s for s in sessions if arm_of[s] == "baseline"][:4]
    chosen += [s for s in sessions if arm_of[s] == "candidate"][:4]
    seen: dict[str, set[str]] = {"baseline": set(), "candidate": set()}
    for session in chosen:
        body = {"model": MODEL, "prompt": f"{session} " * 300, "max_tokens": 4}
        headers = {**HEADERS, "X-Session-ID": session}
        reply = httpx.post(router.url + "/v1/completions", json=body, headers=headers, timeout=60)
        assert reply.status_code == 200, reply.text
        assert reply.headers["x-switchyard-arm"] == arm_of[session]
        assert reply.headers["x-switchyard-stage"] == "decode"
        seen[arm_of[session]].add(reply.headers["x-switchyard-decode-policy"])
    assert seen == {"baseline": {"decode_room"}, "candidate": {"round_robin"}}


def test_a_decode_policy_for_an_arm_of_a_colocated_cluster_is_refused(pd):
    from router_worker.contract.config import ConfigError, parse_config

    document = router_config(pd, "lmetric")
    arm = {"policy": {"kind": "lmetric"}, "weight": 50}
    document["canary"] = {
        "arms": [
            {**arm, "name": "baseline", "instances": ["i0", "i1"]},
            {
                **arm,
                "name": "candidate",
                "instances": ["i2", "i3"],
                "decode_policy": {"kind": "round_robin"},
            },
        ]
    }
    with pytest.raises(ConfigError, match="no decode stage"):
        parse_config(document)
