"""Bodies taken in by the router's worker processes (router_worker/intake.py), live."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import httpx
import pytest

from devharness import wait_until
from tests.router.client_keys import DEBUG_KEY, debug_key_only
from tests.router.helpers import MODEL, router_config


@pytest.fixture
def offload_router(fleet, router_factory):
    document = router_config(fleet, "lmetric", client_auth=debug_key_only())
    document["router"]["offload_body_bytes"] = 0  # every body goes through a worker
    document["router"]["scrape_interval_s"] = 30
    return router_factory(document)


def _workers(pid: int) -> list[int]:
    """The router's intake worker processes (not multiprocessing's resource tracker)."""
    found = []
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        try:
            command = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in command:
            found.append(int(child))
    return found


def test_worker_intake_routes_and_refuses_like_inline(offload_router):
    url = offload_router.url
    prompt = " ".join(f"shared{i}" for i in range(200))
    first = httpx.post(
        url + "/v1/completions",
        timeout=60,
        json={"model": MODEL, "prompt": prompt, "max_tokens": 2},
        headers={"x-switchyard-debug": "1", "Authorization": f"Bearer {DEBUG_KEY}"},
    )
    again = httpx.post(
        url + "/v1/completions",
        timeout=60,
        json={"model": MODEL, "prompt": prompt, "max_tokens": 2},
        headers={"x-switchyard-debug": "1", "Authorization": f"Bearer {DEBUG_KEY}"},
    )
    assert first.status_code == again.status_code == 200
    # The hashes computed in the worker are the ones the KV index learned: a cache hit.
    assert again.headers["x-switchyard-instance"] == first.headers["x-switchyard-instance"]
    assert int(again.headers["x-switchyard-cached-tokens"]) > 0
    chat = httpx.post(
        url + "/v1/chat/completions",
        timeout=60,
        json={
            "model": MODEL,
            "max_tokens": 2,
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
        },
    )
    assert chat.status_code == 200 and chat.text.rstrip().endswith("data: [DONE]")
    # An APIError raised in the worker comes back whole: status, message and param.
    bad = httpx.post(
        url + "/v1/completions",
        timeout=60,
        content=json.dumps({"model": MODEL, "prompt": [1, 2**64]}),
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt"
    assert httpx.post(url + "/v1/completions", timeout=60, content=b"[" * 500).status_code == 400
    state = offload_router.state()
    assert [d["tier"] for d in state["recent_decisions"]][-3:] == ["approx", "approx", "approx"]


def test_a_killed_worker_fails_only_its_request_and_a_new_pool_starts(offload_router):
    url = offload_router.url
    body = {"model": MODEL, "prompt": "hello there", "max_tokens": 2}
    assert httpx.post(url + "/v1/completions", json=body, timeout=60).status_code == 200
    workers = _workers(offload_router.process.pid)
    assert workers, "no intake worker process"
    for pid in workers:
        os.kill(pid, signal.SIGKILL)
    statuses = []
    for _ in range(3):
        response = httpx.post(url + "/v1/completions", json=body, timeout=60)
        statuses.append(response.status_code)
        if response.status_code != 200:
            assert response.status_code == 503 and response.json()["error"]["message"]
    assert statuses[-1] == 200 and statuses.count(503) <= 1, statuses
    wait_until(
        lambda: bool(set(_workers(offload_router.process.pid)) - set(workers)),
        10,
        "a new intake worker",
    )
    assert offload_router.process.poll() is None


def test_workers_die_with_a_killed_router(offload_router):
    body = {"model": MODEL, "prompt": "hello there", "max_tokens": 2}
    assert (
        httpx.post(offload_router.url + "/v1/completions", json=body, timeout=60).status_code == 200
    )
    workers = _workers(offload_router.process.pid)
    assert workers
    offload_router.process.kill()
    offload_router.process.wait()
    wait_until(
        lambda: not any(Path(f"/proc/{pid}").exists() for pid in workers),
        10,
        "the intake workers to exit",
    )
