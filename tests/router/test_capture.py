"""Traffic capture at the router: every finished request reaches the cluster's capture
stream as the replay needs it (lengths, digests, measured latencies), never its text."""

from __future__ import annotations

import httpx
import redis

from devharness import wait_until
from router_worker.contract import telemetry as contract
from tests.router.helpers import MODEL, router_config, stream_entries

SALT = "a" * 32
SECRET_USER = "alice-secret-session"


def _captured(client: redis.Redis) -> list[contract.CaptureBatch]:
    entries = stream_entries(client, contract.capture_stream("test"))
    return [contract.CaptureBatch.from_stream_fields(fields) for _, fields in entries]


def _requests(client: redis.Redis) -> list[contract.CaptureRecord]:
    return [r for batch in _captured(client) for r in batch.requests]


def _chat(router, user: str, text: str, stream: bool = False) -> httpx.Response:
    """A chat completion (streamed: the router measures TTFT and TPOT on streams only)."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 4,
        "user": user,
        "stream": stream,
    }
    return httpx.post(router.url + "/v1/chat/completions", json=body, timeout=30)


def _telemetry_round_after(client: redis.Redis, router, requests: int) -> None:
    """Wait until the telemetry writer has shipped everything of the first ``requests``
    requests: a state snapshot counting them is written at the start of a round whose
    flush (events, metrics, capture) follows; a newer snapshot starts the next round,
    so that flush is done."""
    key = contract.state_key("test", f"r{router.port}")

    def snapshot() -> contract.StateSnapshot | None:
        raw = client.get(key)
        return None if raw is None else contract.loads_state(raw)

    def counted() -> float | None:
        state = snapshot()
        return state.ts if state is not None and state.window.requests >= requests else None

    counted_at = wait_until(counted, 10, f"a state snapshot counting {requests} requests")
    wait_until(
        lambda: (state := snapshot()) is not None and state.ts > counted_at,
        10,
        "the telemetry writer's next round",
    )


def _apply(router, document: dict) -> int:
    response = httpx.post(
        router.url + "/admin/config", json=document, headers=router.admin_headers, timeout=10
    )
    response.raise_for_status()
    return response.json()["applied_version"]


def test_a_capture_records_each_request_with_salted_digests_and_no_text(
    fleet, router_factory, private_redis
):
    document = router_config(fleet, "round_robin", capture={"id": 7, "salt": SALT})
    router = router_factory(document, redis_url=private_redis.url)
    client = redis.Redis(port=private_redis.port)
    shared = "the same long system prompt " * 30
    for question in ("first question", "second question"):
        assert _chat(router, SECRET_USER, shared + question, stream=True).status_code == 200
    assert _chat(router, "bob", "short and different").status_code == 200
    wait_until(lambda: len(_requests(client)) == 3, 10, "three captured requests")

    batches = _captured(client)
    assert {(b.capture, b.cluster) for b in batches} == {(7, "test")}
    assert {b.max_model_len for b in batches} == {32768}  # enginesim's Qwen2-7B, scraped
    first, second, other = sorted(_requests(client), key=lambda r: r.at)
    assert first.prompt_tokens > 100 and first.output_tokens == 4 and first.status == 200
    assert (
        first.ttft_s is not None and first.ttft_s > 0 and first.instance in {"i0", "i1", "i2", "i3"}
    )
    blocks = [contract.decode_block_hashes(r.block_hashes, 10_000) for r in (first, second, other)]
    assert first.block_size == 16 and len(blocks[0]) == first.prompt_tokens // 16
    # the shared system prompt gives the same leading blocks, the other user's prompt none
    assert blocks[0][:5] == blocks[1][:5] and blocks[0][-1] != blocks[1][-1]
    assert not set(blocks[2]) & set(blocks[0])
    # one session, as a keyed digest
    assert first.session == second.session != other.session
    assert first.session is not None and len(first.session) == 16
    raw = "".join(
        str(value)
        for _, fields in stream_entries(client, contract.capture_stream("test"))
        for value in fields.values()
    )
    assert "question" not in raw and "system prompt" not in raw and SECRET_USER not in raw


def test_another_capture_digests_sessions_under_its_own_salt_and_none_records_nothing(
    fleet, router_factory, private_redis
):
    prompt = "identical prompt for both captures " * 20
    document = router_config(fleet, "round_robin", capture={"id": 1, "salt": SALT})
    router = router_factory(document, redis_url=private_redis.url)
    client = redis.Redis(port=private_redis.port)
    assert _chat(router, "u", prompt).status_code == 200
    wait_until(lambda: len(_requests(client)) == 1, 10, "first capture")

    second = router_config(fleet, "round_robin", version=2, capture={"id": 2, "salt": "b" * 32})
    assert _apply(router, second) == 2
    assert _chat(router, "u", prompt).status_code == 200
    wait_until(lambda: len(_requests(client)) == 2, 10, "second capture")
    one, two = sorted(_requests(client), key=lambda r: r.at)
    assert [b.capture for b in _captured(client)] == [1, 2]
    # each request names the config version and the arm it was routed under
    assert (one.config_version, one.arm) == (0, "default")  # the document had no version
    assert (two.config_version, two.arm) == (2, "default")
    # keyed at the router, per capture: the same prompt shares no block id across captures
    # (raw hashes, the prompt's fingerprint, never leave the router)
    assert all(b.keyed for b in _captured(client))
    ones, twos = (contract.decode_block_hashes(r.block_hashes, 10_000) for r in (one, two))
    assert len(ones) == len(twos) > 10 and not set(ones) & set(twos)
    assert one.session is not None and two.session is not None and one.session != two.session

    assert _apply(router, router_config(fleet, "round_robin", version=3)) == 3
    assert _chat(router, "u", prompt).status_code == 200
    _telemetry_round_after(client, router, requests=3)
    assert len(_requests(client)) == 2  # no capture in the config: nothing recorded
