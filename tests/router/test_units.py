"""Unit tests of the router's pieces that need no processes."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import random

import msgpack
import numpy as np
import pytest
import zmq
import zmq.asyncio

from router_worker.arms import arm_salt, pick_arm, session_point
from router_worker.contract.config import parse_config
from router_worker.errors import APIError
from router_worker.health import HealthBook
from router_worker.intake import take_in
from router_worker.limits import Limiter
from router_worker.metrics import RouterMetrics
from router_worker.routing import ClusterState, session_key_from_request
from router_worker.routing.sessions import SESSION_SOURCES
from router_worker.runtime import Runtime, build_runtime
from router_worker.tokenization import PromptError, Tokenizer, approx_token_ids


def test_approx_chunker_is_prefix_stable_and_four_bytes_per_token():
    short, long = approx_token_ids("hello world, "), approx_token_ids("hello world, and more")
    assert len(approx_token_ids("a" * 400)) == 100
    assert list(long[: len(short) - 1]) == list(short[:-1])  # last chunk of short is padded
    assert list(approx_token_ids("same text")) == list(approx_token_ids("same text"))


def test_chat_template_turns_extend_each_other():
    first = [{"role": "user", "content": "hi"}]
    second = [
        *first,
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "more"},
    ]
    tokenizer = Tokenizer(None, "chatml")
    one, two = (tokenizer.render({"messages": m}) for m in (first, second))
    assert two.startswith(one + "hello<|im_end|>\n")
    with pytest.raises(PromptError):
        tokenizer.render({"messages": [{"content": "no role"}]})


def test_exact_tier_uses_a_local_tokenizer_json(tmp_path):
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers

    vocab = {"[UNK]": 0, "hello": 1, "world": 2, "again": 3}
    tiny = HFTokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tiny.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tiny.save(str(path))
    tokenizer = Tokenizer(str(path), chat_template="plain")
    ids, tier = tokenizer.encode_prompt("hello world again", add_special_tokens=True)
    assert tier == "exact" and list(ids) == [1, 2, 3]
    _, chat_tier = tokenizer.encode_chat([{"role": "user", "content": "hello"}])
    assert chat_tier == "exact"
    token_ids, ids_tier = tokenizer.encode_prompt([5, 6, 7], add_special_tokens=True)
    assert ids_tier == "ids" and list(token_ids) == [5, 6, 7]
    batch_ids, _ = tokenizer.encode_prompt([[8, 9], [1]], add_special_tokens=True)
    assert list(batch_ids) == [8, 9]  # a batch is routed by its first prompt
    assert Tokenizer().encode_prompt("hello", add_special_tokens=True)[1] == "approx"


@pytest.mark.parametrize("prompt", [[1, -2], [2**64], [], [[]], [1, "2"], [True]])
def test_intake_refuses_token_ids_the_router_cannot_hash(prompt):
    body = json.dumps({"model": "m", "prompt": prompt}).encode()
    with pytest.raises(APIError) as refused:
        take_in(body, "completions", Tokenizer(), block_size=16)
    assert refused.value.status == 400 and refused.value.param == "prompt"


def test_arm_assignment_is_stable_and_follows_weights():
    rng = random.Random(1)
    assert pick_arm([100.0], "anything", rng) == 0
    cumulative = [30.0, 100.0]
    assert pick_arm(cumulative, "user-7", rng) == pick_arm(cumulative, "user-7", rng)
    picks = [pick_arm(cumulative, f"user-{k}", rng) for k in range(4000)]
    assert 0.26 < picks.count(0) / len(picks) < 0.34
    assert 0 <= session_point("x", arm_salt("canary secret")) < 100


def _canary_runtime(salt: str | None) -> Runtime:
    arm = {"policy": {"kind": "round_robin"}}
    canary: dict = {
        "arms": [
            {**arm, "name": "baseline", "weight": 90, "instances": ["i0"]},
            {**arm, "name": "candidate", "weight": 10, "instances": ["i1"]},
        ]
    }
    if salt is not None:
        canary["salt"] = salt
    config = parse_config(
        {
            "instances": [{"name": f"i{k}", "url": f"http://127.0.0.1:{1 + k}"} for k in (0, 1)],
            "policy": {"kind": "round_robin"},
            "canary": canary,
        }
    )
    state = ClusterState()
    for name in ("i0", "i1"):
        state.add_instance(name)
    return build_runtime(config, state, Tokenizer(), None)


@pytest.mark.parametrize("salt", ["per-canary secret", None])
def test_a_client_cannot_pick_its_canary_arm_by_picking_its_session_key(salt):
    """Keys a client chose with the public hash to land in the 10% arm land there about
    10% of the time; each session still keeps its arm, on every router with the salt."""

    def public_point(key: str) -> float:
        digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") * 100.0 / (1 << 64)

    chosen = [k for k in (f"hdr:s{n}" for n in range(5000)) if public_point(k) >= 90][:200]
    runtime, other_router = _canary_runtime(salt), _canary_runtime(salt)
    arms = [runtime.arm_for(key).name for key in chosen]
    assert arms.count("candidate") < len(chosen) / 3, arms.count("candidate")
    assert [runtime.arm_for(key).name for key in chosen] == arms
    if salt is not None:
        assert [other_router.arm_for(key).name for key in chosen] == arms


@pytest.mark.parametrize(
    ("header", "source"),
    [
        ("X-Session-ID", "header"),
        ("X-Dynamo-Session-ID", "harness"),
        ("X-Claude-Code-Agent-ID", "harness"),
        ("x-claude-code-session-id", "harness"),
        ("session-id", "harness"),
        ("session_id", "harness"),
    ],
)
def test_a_harness_session_header_keys_the_canary_arm_as_x_session_id_does(header, source):
    """Whichever header carries the session (X-Session-ID or one an agent harness sends on
    its own, router_worker/routing/sessions.py), each session keeps its arm on every router
    and the sessions split by the arms' weights; with that source off there is no key."""
    values = [f"conv-{n}" for n in range(2000)]
    body = {"user": "one-user-for-all"}  # a later source: must not decide the arm
    keys = [session_key_from_request({header: v}, body) for v in values]
    assert all(keys) and len(set(keys)) == len(keys)
    runtime, other_router = _canary_runtime("secret"), _canary_runtime("secret")
    arms = [runtime.arm_for(key).name for key in keys]
    assert [other_router.arm_for(key).name for key in keys] == arms
    assert [runtime.arm_for(key).name for key in keys] == arms
    assert 0.07 < arms.count("candidate") / len(arms) < 0.13
    others = [s for s in SESSION_SOURCES if s not in (source, "user")]
    assert session_key_from_request({header: values[0]}, body, others) is None


def test_circuit_breaker_opens_half_opens_and_closes():
    changes: list[tuple[str, str, str]] = []
    book = HealthBook(
        lambda name, before, after, cause: changes.append((name, before, after)),
        failures_to_open=2,
        open_s=1.0,
    )
    book.configure({"a": "enabled", "b": "draining"}, 2, 1.0)
    assert book.effective("b") == "draining"
    book.record_failure("a", 0.0, "http_5xx")
    assert book.effective("a") == "healthy"
    book.record_failure("a", 0.1, "http_5xx")
    assert book.effective("a") == "down" and not book.due_for_probe("a", 0.5)
    book.record_probe("a", False, 1.2)  # still failing: open longer
    assert book.instances["a"].open_for == 2.0 and not book.due_for_probe("a", 2.0)
    book.record_probe("a", True, 3.3)
    assert book.instances["a"].breaker == "half_open" and book.effective("a") == "healthy"
    book.record_failure("a", 3.4, "connect")  # one failure in half-open re-opens
    assert book.effective("a") == "down"
    book.record_probe("a", True, 10.0)
    book.record_success("a")
    assert book.instances["a"].breaker == "closed"
    book.record_failure("a", 11.0, "connect", fatal=True)
    assert book.effective("a") == "down"
    assert changes[:3] == [
        ("b", "healthy", "draining"),
        ("a", "healthy", "down"),
        ("a", "down", "healthy"),
    ]


def test_limiter_queues_then_refuses():
    async def scenario() -> None:
        limiter = Limiter(max_concurrency=1, max_queue=1, queue_timeout_s=0.2)
        await limiter.acquire()
        waiter = asyncio.create_task(limiter.acquire())
        await asyncio.sleep(0)
        with pytest.raises(APIError) as full:
            await limiter.acquire()
        assert full.value.status == 429
        limiter.release()  # hands the slot to the waiter
        await waiter
        assert limiter.active == 1
        with pytest.raises(APIError) as timed_out:
            await limiter.acquire()
        assert timed_out.value.status == 503 and limiter.queued == 0
        limiter.release()
        assert limiter.active == 0

    asyncio.run(scenario())


class _FakeState:
    def __init__(self) -> None:
        self.ids = ["e0"]
        self.batches: list[int] = []

    def on_kv_event_batch(self, name, batch, now) -> None:
        self.batches.append(len(batch.events))


class _FakeCore:
    def __init__(self) -> None:
        self.state = _FakeState()


def _payload(count: int) -> bytes:
    events = [["BlockRemoved", [k], "GPU"] for k in range(count)]
    return msgpack.packb([1.0, events, 0])


def test_kv_subscriber_recovers_a_sequence_gap_through_replay():
    from router_worker.kv_subscriber import Subscriber

    async def scenario() -> list[int]:
        context = zmq.asyncio.Context()
        replay = context.socket(zmq.ROUTER)
        port = replay.bind_to_random_port("tcp://127.0.0.1")
        history = {seq: _payload(seq + 1) for seq in range(4)}

        async def serve() -> None:
            client, _, start = await replay.recv_multipart()
            for seq in range(int.from_bytes(start, "big"), 4):
                await replay.send_multipart([client, b"", seq.to_bytes(8, "big"), history[seq]])
            await replay.send_multipart([client, b"", (-1).to_bytes(8, "big", signed=True), b""])

        server = asyncio.create_task(serve())
        core = _FakeCore()
        sub = Subscriber(core, "e0", "tcp://127.0.0.1:1", f"tcp://127.0.0.1:{port}", context)
        await sub.receive(0, history[0])
        await sub.receive(3, history[3])  # 1 and 2 were lost
        await server
        replay.close(linger=0)
        context.destroy(linger=0)
        assert sub.stats.gaps == 1 and sub.stats.unrecovered_gaps == 0
        await sub.receive(0, history[0])  # sequence restarts: the publisher restarted
        assert sub.stats.restarts == 1
        return core.state.batches

    assert asyncio.run(scenario()) == [1, 2, 3, 4, 1, 1]


def test_tokens_are_hashed_from_numpy_arrays():
    ids = approx_token_ids("x" * 64)
    assert isinstance(ids, np.ndarray) and ids.dtype == np.dtype("<u4")


def test_a_long_session_value_is_kept_as_a_digest_a_normal_one_as_is():
    def user_of(value: str) -> str | None:
        body = json.dumps({"model": "m", "prompt": "hi", "user": value}).encode()
        return take_in(body, "completions", Tokenizer(), block_size=16).user

    assert user_of("alice@example.com") == "alice@example.com"
    long_a, long_b = user_of("a" * 4_000_000), user_of("b" * 4_000_000)
    assert long_a is not None and len(long_a) < 100
    assert long_a == user_of("a" * 4_000_000) != long_b  # still one session per value
    header = session_key_from_request({"X-Session-ID": "s" * 1_000_000}, {})
    assert header is not None and len(header) < 100
    assert session_key_from_request({"X-Session-ID": "conv-42"}, {}) == "hdr:conv-42"


def test_the_gc_pauses_are_timed_by_generation_while_watched():
    metrics = RouterMetrics()

    def full_collections() -> int:
        return sum(metrics.gc_pause.labels("2").counts)

    unwatch = metrics.watch_gc()
    try:
        gc.collect()
        assert full_collections() >= 1
        assert metrics.gc_pause.labels("2").sum > 0
    finally:
        unwatch()
    seen = full_collections()
    gc.collect()
    assert full_collections() == seen  # no longer watched
