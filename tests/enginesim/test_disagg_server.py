"""enginesim's HTTP server speaks vLLM's disaggregated interface (NIXL kv_transfer_params),
driven as vLLM's toy proxy drives it: a prefill call (do_remote_decode, max_tokens 1, not
streamed) whose answer says where its held blocks are, then a decode call carrying those
params that reads them over the link and streams the answer."""

from __future__ import annotations

import httpx
import msgpack
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

import engine_interface as ei
from devharness import wait_until
from enginesim.engine import MODELS
from tests.enginesim.helpers import MODEL, scrape, value
from tests.enginesim.test_server_kv_events import _event_tokens, _subscribe
from tests.fleets import fast_fleet

PREFILL, DECODE, BOTH = 0, 1, 2
PROMPT = list(range(1000, 1000 + 700))  # token ids: 43 full blocks and 12 tokens
KV_BYTES_PER_TOKEN = MODELS["qwen2-7b"].kv_bytes_per_token()
PREFILL_PARAMS = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


@pytest.fixture(scope="module")
def pd():
    with fast_fleet(3, kv_events=True, extra=["--roles", "prefill@0,decode@1"]) as fleet:
        yield fleet


def prefill(url: str, prompt: list[int] = PROMPT) -> dict:
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": 1,
        "stream": False,
        "kv_transfer_params": PREFILL_PARAMS,
    }
    reply = httpx.post(url + "/v1/completions", json=body, timeout=30)
    reply.raise_for_status()
    return reply.json()["kv_transfer_params"]


def decode(
    url: str, params: dict, max_tokens: int = 20, prompt: list[int] = PROMPT
) -> httpx.Response:
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "kv_transfer_params": params,
    }
    return httpx.post(url + "/v1/completions", json=body, timeout=30)


def metric(url: str, metric: ei.MetricName, suffix: str = "") -> float:
    return value(scrape(url), metric.name + suffix)


def test_the_toy_proxy_flow_reads_the_held_blocks(pd):
    prefill_url, decode_url = pd.url(PREFILL), pd.url(DECODE)
    bytes_before = metric(decode_url, ei.NIXL_BYTES, "_sum")
    params = prefill(prefill_url)
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    assert params["remote_port"] == int(prefill_url.rsplit(":", 1)[1])
    assert params["remote_host"] == "127.0.0.1"
    assert len(params["remote_block_ids"]) == -(-len(PROMPT) // 16)
    assert isinstance(params["remote_engine_id"], str) and params["remote_request_id"]
    assert metric(prefill_url, ei.KV_HELD_REQUESTS) >= 1

    reply = decode(decode_url, params)
    assert reply.status_code == 200, reply.text
    usage = reply.json()["usage"]
    assert usage["completion_tokens"] == 20
    assert usage["prompt_tokens_details"]["cached_tokens"] == len(PROMPT) - 1
    moved = metric(decode_url, ei.NIXL_BYTES, "_sum") - bytes_before
    assert moved == (len(PROMPT) - 1) * KV_BYTES_PER_TOKEN
    # Read, the blocks are released on the prefill side.
    wait_until(lambda: metric(prefill_url, ei.KV_HELD_REQUESTS) == 0, 30, "hold released")
    # A second read of the same blocks fails: they are gone.
    failed = metric(decode_url, ei.NIXL_FAILED, "_total")
    again = decode(decode_url, params)
    assert again.status_code == 500 and "KV transfer failed" in again.json()["error"]["message"]
    assert metric(decode_url, ei.NIXL_FAILED, "_total") == failed + 1


def test_the_openai_sdk_streams_a_disaggregated_chat(pd):
    messages: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "tell me about switchyards " * 40}
    ]
    first = openai.OpenAI(base_url=pd.url(PREFILL) + "/v1", api_key="x", max_retries=0)
    answer = first.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=1,
        extra_body={"kv_transfer_params": PREFILL_PARAMS},
    )
    assert answer.model_extra is not None
    params = answer.model_extra["kv_transfer_params"]
    assert params["do_remote_prefill"] is True
    second = openai.OpenAI(base_url=pd.url(DECODE) + "/v1", api_key="x", max_retries=0)
    chunks = second.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"kv_transfer_params": params},
    )
    usage = [c.usage for c in chunks if c.usage is not None][-1]
    assert usage.completion_tokens == 12
    details = usage.prompt_tokens_details
    assert details is not None and details.cached_tokens == usage.prompt_tokens - 1


def test_both_roles_publish_kv_events(pd):
    prefill_url, decode_url = pd.url(PREFILL), pd.url(DECODE)
    prefill_sub, _ = _subscribe(pd.kv_endpoint(PREFILL), prefill_url)
    decode_sub, _ = _subscribe(pd.kv_endpoint(DECODE), decode_url)
    prompt = list(range(30_000, 30_000 + 64))  # four full blocks
    params = prefill(prefill_url, prompt)
    assert decode(decode_url, params, max_tokens=2, prompt=prompt).status_code == 200
    for sock in (prefill_sub, decode_sub):
        stored: list[int] = []
        while sum(1 for t in stored if t >= 30_000) < 48:  # the 3 blocks the decode reads
            _, _, payload = sock.recv_multipart()
            for event in msgpack.unpackb(payload)[1]:
                stored += _event_tokens(event)
        sock.close()
    assert set(prompt[:48]) <= set(stored)


@pytest.mark.parametrize(
    ("index", "params", "field"),
    [
        (PREFILL, {"do_remote_prefill": True}, "kv_transfer_params"),
        (DECODE, {"do_remote_decode": True}, "kv_transfer_params"),
        (BOTH, {"do_remote_decode": "yes"}, "kv_transfer_params.do_remote_decode"),
        (BOTH, {"do_remote_prefill": True, "remote_engine_id": "e"}, "kv_transfer_params."),
        (BOTH, {"do_remote_prefill": True, "remote_block_ids": [1, -2]}, "kv_transfer_params"),
        (BOTH, [], "kv_transfer_params"),
    ],
)
def test_bad_or_misplaced_params_are_refused_naming_the_field(pd, index, params, field):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 2, "kv_transfer_params": params}
    reply = httpx.post(pd.url(index) + "/v1/completions", json=body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert field in (error["param"] or "") or field in error["message"]


def test_a_streamed_prefill_is_refused(pd):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 1, "stream": True}
    body["kv_transfer_params"] = PREFILL_PARAMS
    reply = httpx.post(pd.url(PREFILL) + "/v1/completions", json=body)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "stream"


def test_a_role_both_instance_serves_both_halves_and_plain_requests(pd):
    both = pd.url(BOTH)
    plain = httpx.post(both + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 3})
    assert plain.status_code == 200 and plain.json()["kv_transfer_params"] is None
    params = prefill(pd.url(PREFILL))
    assert decode(both, params, max_tokens=3).status_code == 200


def test_a_read_of_another_engine_fails():
    with fast_fleet(2, extra=["--roles", "prefill@0,decode@1"]) as fleet:
        params = prefill(fleet.url(0))
        wrong = {**params, "remote_engine_id": "0" * 32}
        reply = decode(fleet.url(1), wrong)
        assert reply.status_code == 500 and "restarted?" in reply.json()["error"]["message"]
        assert metric(fleet.url(0), ei.KV_HELD_REQUESTS) == 1  # still held for the right one
        assert decode(fleet.url(1), params).status_code == 200


def test_a_hold_never_read_times_out():
    extra = ["--roles", "prefill@0,decode@1", "--kv-hold-timeout", "2"]
    with fast_fleet(2, extra=extra) as fleet:
        prefill_url = fleet.url(0)
        params = prefill(prefill_url)
        wait_until(lambda: metric(prefill_url, ei.KV_HOLDS_EXPIRED, "_total") == 1, 20, "expiry")
        assert metric(prefill_url, ei.KV_HELD_REQUESTS) == 0
        assert metric(prefill_url, ei.KV_USAGE) == 0
        reply = decode(fleet.url(1), params)
        assert reply.status_code == 500 and "timed out" in reply.json()["error"]["message"]


def test_hardware_says_the_role_and_link(pd):
    hardware = httpx.get(pd.url(DECODE) + "/admin/hardware").json()
    assert hardware["role"] == "decode" and hardware["kv_link"] == "rdma"
