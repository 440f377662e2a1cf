"""Failure handling against real processes: kills, 5xx, mid-stream drops, bad input, aborts."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

import engine_interface as ei
from devharness import free_port, wait_until
from tests.router.client_keys import DEBUG_KEY, debug_key_only
from tests.router.helpers import MODEL, launch_router, router_config, scrape_total


@pytest.fixture(scope="module")
def small_body_router(fleet, tmp_path_factory):
    document = router_config(fleet)
    document["router"]["max_body_bytes"] = 4096
    router = launch_router(tmp_path_factory.mktemp("router"), document)
    yield router
    router.stop()


def _body(tag: str, stream: bool = False, max_tokens: int = 8) -> dict:
    prompt = " ".join(f"{tag}{i}" for i in range(80))
    return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": stream}


async def _one(client: httpx.AsyncClient, url: str, body: dict) -> tuple[int, str, str]:
    if body.get("stream"):
        async with client.stream("POST", url, json=body) as response:
            text = (await response.aread()).decode()
            return response.status_code, response.headers.get("x-switchyard-instance", ""), text
    response = await client.post(url, json=body)
    return response.status_code, response.headers.get("x-switchyard-instance", ""), response.text


async def _load(
    url: str, count: int, concurrency: int, stream: bool, max_tokens: int = 8
) -> list[tuple]:
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=30) as client:

        async def run(k: int) -> tuple:
            async with gate:
                return await _one(client, url, _body(f"load{k}-", stream, max_tokens))

        return await asyncio.gather(*(run(k) for k in range(count)))


def test_killed_instance_requests_retried_marked_down_and_back(fleet, router_factory):
    router = router_factory(router_config(fleet, "round_robin"))
    url = router.url + "/v1/completions"

    async def scenario() -> list[tuple]:
        load = asyncio.create_task(_load(url, 160, 8, stream=True, max_tokens=40))
        await asyncio.sleep(0.5)
        await asyncio.to_thread(fleet.fault, 1, "kill")
        return await load

    try:
        results = asyncio.run(scenario())
        failed = [r for r in results if r[0] != 200]
        assert not failed, failed[:3]
        # Every stream ends: those mid-stream on i1 when it died with an SSE error event,
        # all others (including the ones retried away from i1) with their tokens.
        assert all(r[2].rstrip().endswith("data: [DONE]") for r in results)
        broken = [r for r in results if '"error"' in r[2]]
        assert all(r[1] == "i1" for r in broken)
        assert len(broken) <= 8  # at most the streams that were running on i1
        # Whether any request still reached the dead i1 (and was retried) depends on how
        # soon the 0.2 s probes saw it: retries themselves are pinned down by the 5xx test.
        wait_until(lambda: router.health_of("i1") == "down", 5, "i1 marked down")
        after = asyncio.run(_load(url, 12, 4, stream=False))
        assert all(r[0] == 200 and r[1] != "i1" for r in after)
        events = router.state()["recent_events"]
        assert any(
            e["kind"] == "health"
            and e["payload"]["instance"] == "i1"
            and e["payload"]["after"] == "down"
            for e in events
        )
    finally:
        fleet.fault(1, "recover")
    wait_until(lambda: router.health_of("i1") == "healthy", 20, "i1 back")
    back = asyncio.run(_load(url, 8, 4, stream=False))
    assert "i1" in {r[1] for r in back}


def test_5xx_before_first_byte_is_retried_elsewhere(fleet, router_factory):
    document = router_config(fleet, "round_robin")
    document["router"]["breaker_failures"] = 100  # keep i2 eligible: every pass hits it
    router = router_factory(document)
    fleet.fault(2, "error5xx")
    try:
        results = asyncio.run(_load(router.url + "/v1/completions", 12, 1, stream=False))
    finally:
        fleet.fault(2, "recover")
    assert all(r[0] == 200 and r[1] != "i2" for r in results)
    metrics = router.metrics()
    assert "switchyard_router_retries_total{instance=" in metrics
    assert 'kind="http_5xx"' in metrics


POISON = "POISON-7f3a"  # the input the poisoned engines fail on


def test_request_failing_alike_on_two_instances_is_not_retried_nor_held_against_them(
    fleet, router_factory
):
    document = router_config(fleet, "round_robin")
    document["router"] |= {"breaker_failures": 1, "max_attempts": 4}
    router = router_factory(document)
    names = [i["name"] for i in fleet.instances()]
    for index in range(len(names)):
        fleet.fault(index, "poison", match=POISON)
    try:
        poisoned = httpx.post(
            router.url + "/v1/completions",
            timeout=30,
            json=_body("bad") | {"prompt": f"tell me {POISON} now"},
        )
        fine = asyncio.run(_load(router.url + "/v1/completions", 4, 2, stream=False))
        healths = {name: router.health_of(name) for name in names}
    finally:
        for index in range(len(names)):
            fleet.fault(index, "recover")
    assert poisoned.status_code == 502
    error = poisoned.json()["error"]
    assert "failed on 2 instances alike" in error["message"], error
    assert "poison" in error["message"]  # the engine's own words are passed on
    assert scrape_total(router.url, "switchyard_router_retries_total") == 1
    # A strike per engine would have opened every breaker (breaker_failures 1).
    assert set(healths.values()) == {"healthy"}, healths
    assert all(r[0] == 200 for r in fine)
    events = router.state()["recent_events"]
    exhausted = [e["payload"] for e in events if e["kind"] == "retries_exhausted"]
    assert len(exhausted) == 1 and exhausted[0]["request_suspected"] is True
    assert len(set(exhausted[0]["instances"])) == 2
    assert not [e for e in events if e["kind"] == "health"]


def test_5xx_is_held_against_the_instance_once_another_serves_the_request(fleet, router_factory):
    # i2 fails the marked requests while its /health stays good: only the passive strike,
    # charged when i3 serves the retry, can open its breaker.
    document = router_config(fleet, "round_robin", instances=fleet.instances()[2:4])
    document["router"] |= {"breaker_failures": 1, "breaker_open_s": 30.0}
    router = router_factory(document)
    fleet.fault(2, "poison", match=POISON)
    try:
        answers = [
            httpx.post(
                router.url + "/v1/completions",
                timeout=30,
                json=_body(f"odd{k}") | {"prompt": f"{POISON} {k}"},
            )
            for k in range(2)
        ]
    finally:
        fleet.fault(2, "recover")
    assert [a.status_code for a in answers] == [200, 200]
    assert {a.headers["x-switchyard-instance"] for a in answers} == {"i3"}
    assert "retry" in {a.headers["x-switchyard-reason"] for a in answers}
    health = [e["payload"] for e in router.state()["recent_events"] if e["kind"] == "health"]
    assert any(
        p["instance"] == "i2" and p["after"] == "down" and p["cause"] == "http_5xx" for p in health
    ), health


def _broken_stream(router, fleet, headers: dict[str, str]) -> list[str]:
    fleet.fault(3, "drop_midstream", after_chunks=3)
    try:
        with httpx.Client(timeout=30) as client:
            response = client.post(
                router.url + "/v1/completions",
                json=_body("mid", stream=True, max_tokens=20),
                headers=headers,
            )
    finally:
        fleet.fault(3, "recover")
    assert response.status_code == 200
    return [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]


def test_mid_stream_failure_ends_with_an_sse_error_event(fleet, router_factory):
    document = router_config(
        fleet, "round_robin", instances=fleet.instances()[3:4], client_auth=debug_key_only()
    )
    router = router_factory(document)
    events = _broken_stream(router, fleet, {})
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == 502
    assert len(events) == 3 + 2  # three relayed chunks, the error, [DONE]
    # The error names the instance only to a debug client.
    assert "i3" not in error["message"] and "failed mid-stream" in error["message"]
    debug = {"Authorization": f"Bearer {DEBUG_KEY}", "x-switchyard-debug": "1"}
    debugged = json.loads(_broken_stream(router, fleet, debug)[-2])["error"]["message"]
    assert debugged.startswith("The engine i3 failed mid-stream")
    # A serving-side failure counts against the arm's error rate (the canary judge's guard);
    # a client's bad request (the engine's 400 for a prompt over its context) does not.
    too_long = httpx.post(
        router.url + "/v1/completions",
        timeout=30,
        json=_body("long", max_tokens=1) | {"prompt": [7] * 200_000},
    )
    assert too_long.status_code == 400
    window = router.state()["snapshot"]["window"]
    assert (window["requests"], window["errors"]) == (3, 2)


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/v1/chat/completions", b"{not json", 400, None),
        ("/v1/chat/completions", b"[1, 2]", 400, None),
        (
            "/v1/chat/completions",
            json.dumps({"model": MODEL, "messages": "hi"}).encode(),
            400,
            "messages",
        ),
        (
            "/v1/completions",
            json.dumps({"model": MODEL, "prompt": "x", "stream": "yes"}).encode(),
            400,
            "stream",
        ),
        (
            "/v1/completions",
            json.dumps({"model": MODEL, "prompt": "x", "max_tokens": "5"}).encode(),
            400,
            "max_tokens",
        ),
        (
            "/v1/completions",
            json.dumps({"model": MODEL, "prompt": [1.5, 2]}).encode(),
            400,
            "prompt",
        ),
        ("/v1/completions", json.dumps({"model": "nope", "prompt": "x"}).encode(), 404, "model"),
        ("/v1/completions", json.dumps({"prompt": "x"}).encode(), 400, "model"),
    ],
)
def test_malformed_input_gets_openai_error_body(small_body_router, path, body, status, param):
    router = small_body_router
    response = httpx.post(
        router.url + path, content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == status and error["param"] == param and error["message"]


def test_oversized_body_is_refused_with_413(small_body_router):
    router = small_body_router
    body = {"model": MODEL, "prompt": "x" * 10_000, "max_tokens": 1}
    response = httpx.post(router.url + "/v1/completions", json=body)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == 413

    def chunks():
        yield b'{"model": "' + MODEL.encode() + b'", "prompt": "'
        for _ in range(10):
            yield b"y" * 1000
        yield b'"}'

    chunked = httpx.post(
        router.url + "/v1/completions",
        content=chunks(),
        headers={"content-type": "application/json"},
    )
    assert chunked.status_code == 413


def test_client_disconnect_aborts_the_engine_request(fleet, router_factory):
    document = router_config(fleet, "round_robin", instances=fleet.instances()[0:1])
    router = router_factory(document)
    before = fleet.metric(0, ei.REQUEST_SUCCESS.total, finished_reason="abort")
    body = _body("gone", stream=True, max_tokens=5000)
    with httpx.stream("POST", router.url + "/v1/completions", json=body, timeout=30) as resp:
        for line in resp.iter_lines():
            if '"text"' in line:
                break  # one token seen: the request is running; now hang up
    wait_until(
        lambda: fleet.metric(0, ei.REQUEST_SUCCESS.total, finished_reason="abort") >= before + 1,
        10,
        "enginesim to record the abort",
    )
    wait_until(
        lambda: router.state()["snapshot"]["instances"][0]["in_flight"] == 0,
        5,
        "router accounting to drop the request",
    )


def test_hung_instance_times_out_before_first_byte_and_is_retried(fleet, router_factory):
    document = router_config(fleet, "round_robin")
    document["router"]["first_byte_timeout_s"] = 0.3
    router = router_factory(document)
    fleet.fault(0, "hang")
    try:
        results = asyncio.run(_load(router.url + "/v1/completions", 8, 2, stream=True))
    finally:
        fleet.fault(0, "recover")
    assert all(r[0] == 200 and r[1] != "i0" for r in results)
    assert all(r[2].rstrip().endswith("data: [DONE]") and '"error"' not in r[2] for r in results)
    assert 'kind="timeout"' in router.metrics()


def test_overload_is_refused_with_429(fleet, router_factory):
    document = router_config(fleet, "round_robin")
    document["router"].update(max_concurrency=1, max_queue=0)
    router = router_factory(document)
    results = asyncio.run(_load(router.url + "/v1/completions", 6, 6, stream=True, max_tokens=200))
    statuses = sorted(r[0] for r in results)
    assert statuses[0] == 200 and statuses[-1] == 429
    refused = next(r for r in results if r[0] == 429)
    assert json.loads(refused[2])["error"]["type"] == "RateLimitError"


def test_kv_events_are_received_from_the_engines(fleet, router_factory):
    document = router_config(fleet, "lmetric", instances=fleet.instances(kv=True))
    document["router"]["kv_events"] = True
    router = router_factory(document)
    wait_until(
        lambda: set(router.state()["kv_events"]) == {"i0", "i1", "i2", "i3"},
        10,
        "subscribers running",
    )

    def stored_somewhere() -> bool:
        # ZMQ drops messages sent before a subscription is live: keep sending.
        httpx.post(router.url + "/v1/completions", json=_body("kv", max_tokens=2))
        stats = router.state()["kv_events"]
        return sum(s["batches"] for s in stats.values()) > 0

    wait_until(stored_somewhere, 10, "KV event batches applied")
    stats = router.state()["kv_events"]
    assert all(s["decode_errors"] == 0 for s in stats.values())


def test_hung_instance_is_marked_down_by_probes_with_the_default_settings(fleet, router_factory):
    """No traffic at all: only the active /health probes (default interval, timeout and
    breaker) notice the hang, and the other instances keep being probed meanwhile."""
    document = router_config(fleet, "round_robin")
    del document["router"]
    router = router_factory(document)
    fleet.fault(1, "hang")
    try:
        wait_until(
            lambda: router.state()["breakers"][fleet.instances()[1]["name"]]["breaker"] == "open",
            5,
            "the hung instance's circuit to open",
        )
        breakers = router.state()["breakers"]
    finally:
        fleet.fault(1, "recover")
    assert [name for name, b in breakers.items() if b["breaker"] != "closed"] == [
        fleet.instances()[1]["name"]
    ]


def test_a_failed_request_names_no_engine_address_to_a_plain_client(fleet, router_factory):
    """Before the first byte the last failure's socket-layer text was passed on as it was
    (with the default event loop a refused connection's text quotes the engine's address);
    a plain client gets a generic text, only a debug client the socket's own."""
    port = free_port()  # nothing listens there: every attempt is refused
    dead = [{"name": "gone", "url": f"http://127.0.0.1:{port}"}]
    document = router_config(fleet, "round_robin", instances=dead, client_auth=debug_key_only())
    debug = {"Authorization": f"Bearer {DEBUG_KEY}", "x-switchyard-debug": "1"}
    messages = []
    for headers in ({}, debug):  # a router each: the first refusal marks the engine down
        router = router_factory(document)
        answer = httpx.post(
            router.url + "/v1/completions", timeout=30, json=_body("dead"), headers=headers
        )
        assert answer.status_code == 502
        messages.append(answer.json()["error"]["message"])
    plain, debugged = messages
    assert "could not connect to the engine" in plain and "Errno" not in plain
    assert "could not connect" not in debugged and "refused" in debugged
