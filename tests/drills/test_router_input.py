"""Drills: hostile request bodies on the router's data path.

Nested JSON at every depth, token ids at and beyond 64 bits, and prompts at the size
limit while other clients stream. Every request either succeeds or fails with a clear
error (an OpenAI error body, below 500 for the client's own mistakes); the router stays
up, its indicators return to zero, and the streams running beside the big prompts all
finish. The streams' largest inter-token gap is recorded in the notes, never asserted.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from devharness import wait_until
from tests.drills.clients import MODEL, classify_stream, classify_whole
from tests.drills.helpers import drill_config
from tests.drills.report import Outcome, record
from tests.router.helpers import launch_router

MAX_BODY = 8 * 1024 * 1024  # the router's default limit
DEPTHS = (1, 10, 100, 199, 200, 201, 1000, 10_000, 100_000, 1_000_000)
TOKEN_IDS = (
    [2**63],
    [2**64 - 1],
    [2**64],
    [2**64 + 1],
    [2**100],
    [-1],
    [-(2**64)],
    [1, 2, 2**64],
    [[2**64]],
    [[1, 2], [2**70]],
    [10**300],
    [True, 1],
    [1.0, 2],
    [float("inf")],
)


@pytest.fixture(scope="module")
def router(drill_fleet, tmp_path_factory):
    # The engines take seconds to tokenize an 8 MiB prompt: a first-byte deadline to match.
    document = drill_config(drill_fleet, first_byte_timeout_s=60)
    started = launch_router(tmp_path_factory.mktemp("router-input"), document)
    yield started
    started.stop()


def _indicators(router) -> dict[str, float]:
    state = router.state()
    totals = {"active": state["limiter"]["active"], "queued": state["limiter"]["queued"]}
    for key in ("in_flight", "pending_prefill_tokens", "batch_size"):
        totals[key] = sum(i[key] for i in state["snapshot"]["instances"])
    return totals


def _settled(router) -> None:
    assert router.process.poll() is None, "the router died"
    wait_until(lambda: not any(_indicators(router).values()), 15, "indicators back to zero")
    ok = httpx.post(
        router.url + "/v1/completions",
        timeout=30,
        json={"model": MODEL, "prompt": "still here", "max_tokens": 2},
    )
    assert ok.status_code == 200
    assert "Traceback" not in router.log()


def _verdict(response: httpx.Response) -> str:
    """A 5xx is never a clear answer to a body the client got wrong."""
    verdict = classify_whole(response.status_code, response.text)
    return "lost" if verdict == "clear" and response.status_code >= 500 else verdict


def _nested(depth: int, kind: str, field: str) -> bytes:
    value = (
        b"[" * depth + b"1" + b"]" * depth
        if kind == "array"
        else b'{"a":' * depth + b"1" + b"}" * depth
    )
    return (
        b'{"model": "'
        + MODEL.encode()
        + b'", "max_tokens": 2, "prompt": "hello", "'
        + field.encode()
        + b'": '
        + value
        + b"}"
    )


def test_drill_nested_json(router):
    outcome, statuses = Outcome(), dict[int, int]()
    with httpx.Client(timeout=60, trust_env=False) as client:
        for depth in DEPTHS:
            for kind in ("array", "object"):
                for field in ("metadata", "prompt", "messages"):
                    path = "/v1/chat/completions" if field == "messages" else "/v1/completions"
                    response = client.post(
                        router.url + path,
                        content=_nested(depth, kind, field),
                        headers={"content-type": "application/json"},
                    )
                    statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
                    outcome.add(
                        _verdict(response),
                        f"{depth} {kind} {field} -> {response.status_code} {response.text[:160]}",
                    )
    record(
        "nested JSON bodies (depth 1..10^6)",
        outcome,
        None,
        notes=f"statuses {dict(sorted(statuses.items()))}; nesting deeper than 200 is "
        "refused with 400, shallower nesting in an unread field is forwarded",
    )
    assert outcome.lost == 0, outcome.lost_examples
    _settled(router)


def test_drill_huge_token_ids(router):
    outcome, statuses = Outcome(), dict[int, int]()
    with httpx.Client(timeout=60, trust_env=False) as client:
        for ids in TOKEN_IDS:
            for stream in (False, True):
                raw = json.dumps(
                    {"model": MODEL, "prompt": ids, "max_tokens": 2, "stream": stream}
                ).encode()
                response = client.post(
                    router.url + "/v1/completions",
                    content=raw,
                    headers={"content-type": "application/json"},
                )
                statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
                verdict = (
                    classify_stream(response.status_code, response.text)
                    if stream and response.status_code == 200
                    else _verdict(response)
                )
                outcome.add(
                    verdict, f"{str(ids)[:60]} -> {response.status_code} {response.text[:160]}"
                )
    record(
        "huge and negative token ids",
        outcome,
        None,
        notes=f"statuses {dict(sorted(statuses.items()))}; ids outside [0, 2**64) get "
        "400 from the router, in-range ids beyond the vocabulary the engine's 400",
    )
    assert outcome.lost == 0, outcome.lost_examples
    _settled(router)


def _max_size_bodies() -> list[tuple[str, str, bytes]]:
    """(name, path, body) at and just over the router's body limit."""
    room = MAX_BODY - 200
    text = ("lorem ipsum dolor " * (room // 18 + 1))[:room]
    ids = ",".join(["7"] * (room // 2 - 8))
    chat = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": text}]}
    return [
        (
            "text",
            "/v1/completions",
            json.dumps({"model": MODEL, "max_tokens": 2, "prompt": text}).encode(),
        ),
        (
            "token ids",
            "/v1/completions",
            b'{"model": "'
            + MODEL.encode()
            + b'", "max_tokens": 2, "prompt": ['
            + ids.encode()
            + b"]}",
        ),
        ("chat", "/v1/chat/completions", json.dumps(chat).encode()),
        (
            "over the limit",
            "/v1/completions",
            json.dumps({"model": MODEL, "max_tokens": 2, "prompt": text + "x" * 400}).encode(),
        ),
    ]


async def _streams(url: str, until: asyncio.Event, outcome: Outcome, gaps: list[float]) -> None:
    """Streams back to back until ``until``; every inter-chunk gap is noted."""
    body = {"model": MODEL, "prompt": "a steady stream " * 10, "max_tokens": 40, "stream": True}
    async with httpx.AsyncClient(timeout=60, trust_env=False) as client:
        while not until.is_set():
            chunks, last = [], None
            async with client.stream("POST", url + "/v1/completions", json=body) as response:
                async for chunk in response.aiter_text():
                    now = time.perf_counter()
                    if last is not None:
                        gaps.append(now - last)
                    last = now
                    chunks.append(chunk)
            text = "".join(chunks)
            outcome.add(classify_stream(response.status_code, text), text[-200:])


async def _big_ones(url: str, rounds: int, outcome: Outcome, statuses: dict[int, int]) -> None:
    bodies = _max_size_bodies()
    async with httpx.AsyncClient(timeout=120, trust_env=False) as client:
        for _ in range(rounds):
            for name, path, raw in bodies:
                response = await client.post(
                    url + path, content=raw, headers={"content-type": "application/json"}
                )
                statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
                verdict = classify_whole(response.status_code, response.text)
                outcome.add(
                    "lost" if response.status_code >= 500 else verdict,
                    f"{name} -> {response.status_code} {response.text[:160]}",
                )


def test_drill_max_size_prompts_beside_streams(router):
    streams, big, gaps, statuses = Outcome(), Outcome(), list[float](), dict[int, int]()

    async def drill() -> None:
        done = asyncio.Event()
        streaming = asyncio.gather(*(_streams(router.url, done, streams, gaps) for _ in range(2)))
        try:
            await _big_ones(router.url, 3, big, statuses)
        finally:
            done.set()
            await streaming

    asyncio.run(drill())
    total = Outcome()
    total.merge(streams)
    total.merge(big)
    worst = max(gaps) if gaps else 0.0
    record(
        "max-size prompts beside streams",
        total,
        None,
        notes=f"{big.sent} bodies of ~8 MiB (text, token ids, chat, one over the limit: "
        f"statuses {dict(sorted(statuses.items()))}) while {streams.sent} streams "
        f"ran; largest inter-chunk gap {worst * 1000:.0f} ms (not asserted)",
    )
    assert total.lost == 0, total.lost_examples
    assert streams.succeeded == streams.sent > 0
    assert statuses.get(413) == 3
    _settled(router)
