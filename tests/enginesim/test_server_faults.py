"""Fault knobs and client disconnects (instance 3 of the shared server)."""

from __future__ import annotations

import httpx
import msgpack
import openai
import pytest
import zmq

import engine_interface as ei
from devharness import wait_until
from engine_interface import sample_total
from tests.enginesim.helpers import scrape, value

MODEL = "Qwen/Qwen2-7B-Instruct"
INSTANCE = 3
LONG = {"model": MODEL, "prompt": "fault drill", "max_tokens": 20000, "stream": True}


@pytest.fixture
def url(sim):
    yield sim.url(INSTANCE)
    httpx.post(sim.admin_url + "/admin/fault", json={"instance": INSTANCE, "mode": "recover"})


def set_fault(url: str, **body) -> dict:
    reply = httpx.post(url + "/admin/fault", json=body)
    reply.raise_for_status()
    return reply.json()


def test_error5xx_answers_openai_errors_until_recovered(url):
    set_fault(url, mode="error5xx")
    reply = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 1})
    assert reply.status_code == 500
    assert reply.json()["error"]["type"] == "InternalServerError"
    assert httpx.get(url + "/health").status_code == 500
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.InternalServerError):
        client.completions.create(model=MODEL, prompt="x", max_tokens=1)
    assert set_fault(url, mode="recover")["mode"] == "none"
    assert httpx.get(url + "/health").status_code == 200


def test_poison_fails_only_requests_carrying_the_match(url):
    assert set_fault(url, mode="poison", match="BAD-INPUT")["match"] == "BAD-INPUT"
    bad = httpx.post(
        url + "/v1/completions", json={"model": MODEL, "prompt": "a BAD-INPUT b", "max_tokens": 1}
    )
    assert bad.status_code == 500
    assert "poison" in bad.json()["error"]["message"]
    chat = httpx.post(
        url + "/v1/chat/completions",
        json={
            "model": MODEL,
            "max_tokens": 2,
            "messages": [{"role": "user", "content": "a fine question"}],
        },
    )
    assert chat.status_code == 200 and chat.json()["usage"]["completion_tokens"] == 2
    assert httpx.get(url + "/health").status_code == 200
    refused = httpx.post(url + "/admin/fault", json={"mode": "poison"})
    assert refused.status_code == 400 and "match" in refused.text
    set_fault(url, mode="recover")
    assert (
        httpx.post(
            url + "/v1/completions",
            json={"model": MODEL, "prompt": "a BAD-INPUT b", "max_tokens": 1},
        ).status_code
        == 200
    )


def test_hang_accepts_but_never_answers(url):
    set_fault(url, mode="hang")
    with pytest.raises(httpx.ReadTimeout):
        httpx.get(url + "/health", timeout=0.5)
    set_fault(url, mode="recover")
    assert httpx.get(url + "/health").status_code == 200


def test_drop_midstream_cuts_the_stream_and_aborts_the_request(url):
    before = scrape(url)
    set_fault(url, mode="drop_midstream", after_chunks=3)
    events: list[str] = []
    with (
        pytest.raises(httpx.RemoteProtocolError),
        httpx.stream("POST", url + "/v1/completions", json=LONG) as reply,
    ):
        events.extend(line for line in reply.iter_lines() if line)
    assert 0 < len(events) <= 3 and "data: [DONE]" not in events
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
    after = scrape(url)
    aborts = value(after, ei.REQUEST_SUCCESS.total, finished_reason="abort") - value(
        before, ei.REQUEST_SUCCESS.total, finished_reason="abort"
    )
    assert aborts == 1  # the non-streamed one had finished before its body was cut


def test_slow_stretches_simulated_time(url, sim):
    set_fault(url, mode="slow", factor=4)
    scale = sample_total(scrape(url), "enginesim:time_scale")
    assert scale == pytest.approx(0.05 * 4)
    body = {"model": MODEL, "prompt": "slow", "max_tokens": 3}
    assert httpx.post(url + "/v1/completions", json=body).json()["usage"]["completion_tokens"] == 3
    set_fault(url, mode="recover")
    assert sample_total(scrape(url), "enginesim:time_scale") == 0.05


def test_client_disconnect_aborts_the_engine_request(url):
    before = scrape(url)
    with httpx.stream("POST", url + "/v1/completions", json=LONG) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: {"):
                break

    def aborted() -> bool:
        now = scrape(url)
        return (
            value(now, ei.REQUEST_SUCCESS.total, finished_reason="abort")
            - value(before, ei.REQUEST_SUCCESS.total, finished_reason="abort")
        ) == 1 and value(now, ei.RUNNING.name) == 0

    wait_until(aborted, 10, "the stream to be aborted", ignore=())


def test_kill_closes_the_port_and_recover_restarts_with_empty_cache(url, sim):
    admin = sim.admin_url + "/admin/fault"
    sub: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, 5000)
    sub.connect(sim.kv_endpoint(INSTANCE))
    with (
        pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)),
        httpx.stream("POST", url + "/v1/completions", json=LONG) as reply,
    ):
        killed = False
        for line in reply.iter_lines():
            if line.startswith("data: {") and not killed:
                httpx.post(admin, json={"instance": INSTANCE, "mode": "kill"})
                killed = True
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/health")
    listing = httpx.get(sim.admin_url + "/admin/instances").json()
    assert listing[INSTANCE]["fault"]["mode"] == "kill"

    httpx.post(admin, json={"instance": INSTANCE, "mode": "recover"}).raise_for_status()
    assert httpx.get(url + "/health").status_code == 200
    cleared = False
    while not cleared:
        _, _, payload = sub.recv_multipart()
        cleared = {"type": "AllBlocksCleared"} in msgpack.unpackb(payload)[1]
    sub.close()
    assert value(scrape(url), ei.REQUEST_SUCCESS.total, finished_reason="length") == 0


def test_kill_through_the_instance_port_answers_then_closes(url, sim):
    assert set_fault(url, mode="kill")["mode"] == "kill"

    def refused() -> bool:
        try:
            httpx.get(url + "/health")
        except httpx.ConnectError:
            return True
        except httpx.RemoteProtocolError:
            return False  # accepted as the port closed, then cut: not refused yet
        return False

    wait_until(refused, 10, "connections to be refused", ignore=())
    recover = {"instance": INSTANCE, "mode": "recover"}
    httpx.post(sim.admin_url + "/admin/fault", json=recover).raise_for_status()
    assert httpx.get(url + "/health").status_code == 200


def test_cli_fault_applies_from_startup(sim_factory):
    server = sim_factory("--fault", "1:slow:3", instances=2, kv_events=False)
    assert sample_total(scrape(server.url(0)), "enginesim:time_scale") == pytest.approx(0.05)
    assert sample_total(scrape(server.url(1)), "enginesim:time_scale") == pytest.approx(0.15)
    listing = httpx.get(server.admin_url + "/admin/instances").json()
    assert [item["fault"]["mode"] for item in listing] == ["none", "slow"]


def test_wrong_content_type_answers_html_but_health_is_served(url):
    set_fault(url, mode="wrong_content_type")
    reply = httpx.post(
        url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 1}
    )
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/html")
    assert httpx.get(url + "/health").status_code == 200


def test_garbage_replaces_a_chunk_of_the_stream_and_the_json_body(url):
    set_fault(url, mode="garbage", after_chunks=1)
    body = {"model": MODEL, "prompt": "garbage please", "max_tokens": 4, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body) as reply:
        text = reply.read()
    assert reply.headers["content-type"].startswith("text/event-stream")
    assert text.startswith(b"data: {")
    assert b"<html>" in text
    whole = httpx.post(url + "/v1/completions", json={**body, "stream": False})
    assert whole.headers["content-type"] == "application/json"
    with pytest.raises(ValueError):
        whole.json()


def test_drip_sends_the_same_answer_in_paced_pieces(url):
    assert set_fault(url, mode="drip", period=0.02)["period"] == 0.02
    body = {"model": MODEL, "prompt": "drip please", "max_tokens": 3}
    with httpx.stream("POST", url + "/v1/completions", json=body) as reply:
        pieces = list(reply.iter_raw())
    assert len(pieces) > 1
    assert b"".join(pieces).startswith(b"{")
    with pytest.raises(httpx.HTTPStatusError):
        set_fault(url, mode="drip", period=0)
