"""The live view's decision stream in Debian chromium, end to end: enginesim fleet → a
managed router → Redis → publisher → Channels → the page, under the enforced CSP."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import redis
from django.conf import settings

from devharness import control_plane as cp
from router_worker.contract.telemetry import CandidateScore, DecisionRecord, decisions_stream
from tests.fleets import fast_fleet

from .helpers import login, make_cluster, start_process
from .stack import MODEL, Stack, start_router, wait_for

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(180),
]

HOSTILE = '"><img src=x onerror="window.__pwned=1">'


@pytest.fixture(scope="module")
def decisions_fleet(tmp_path_factory):
    log = tmp_path_factory.mktemp("fleet") / "enginesim.log"
    with fast_fleet(3, log=log) as fleet:
        yield fleet


@pytest.fixture
def one_router(decisions_fleet, asgi_server, tmp_path) -> Iterator[Stack]:
    fleet = decisions_fleet
    cluster = make_cluster([fleet.url(k) for k in range(fleet.size)])
    client = redis.Redis.from_url(settings.REDIS_URL)
    stack = Stack(cluster, [], client)
    try:
        stack.routers = [start_router(cluster, "r1", asgi_server.url, tmp_path)]
        stack.processes.append(start_process(cp.publisher_command(), tmp_path / "publisher.log"))
        stack.wait_reporting(1)
        yield stack
    finally:
        stack.close()
        client.delete(decisions_stream(cluster.name))
        client.close()


def routed(stack: Stack, text: str) -> httpx.Headers:
    """One request through the router; its routing headers (request id, instance, ...)."""
    response = httpx.post(
        f"{stack.routers[0].url}/v1/chat/completions",
        timeout=30,
        json={"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": text}]},
    )
    response.raise_for_status()
    return response.headers


def row(page, headers: httpx.Headers):
    return page.locator(f"#decisions tbody tr[data-request='{headers['x-switchyard-request-id']}']")


def shown_request_ids(page) -> list[str]:
    return page.locator("#decisions tbody tr[data-request]").evaluate_all(
        "rows => rows.map(r => r.dataset.request)"
    )


def test_the_decision_stream_renders_and_follows_new_requests(
    browser, asgi_server, one_router, artifacts_dir
) -> None:
    stack = one_router
    prompt = "Explain the switchyard's routing of long shared prompts. " * 12
    earlier = [routed(stack, f"{prompt} question {n}") for n in range(2)]
    wait_for(
        lambda: stack.redis.xlen(decisions_stream(stack.cluster.name)) >= 2,
        15,
        "the router to ship its first decisions",
    )
    page = login(browser, asgi_server.url, "viewer", bypass_csp=False)
    try:
        page.goto(f"{asgi_server.url}/clusters/{stack.cluster.pk}/")
        page.wait_for_selector("#conn[data-state=live]")
        for headers in earlier:  # the first paint carries what was routed before
            row(page, headers).wait_for(timeout=15_000)
        check_row(row(page, earlier[1]), earlier[1])

        later = [routed(stack, f"{prompt} follow-up {n}") for n in range(2)]
        for headers in later:  # and the websocket adds what is routed now, on top
            row(page, headers).wait_for(timeout=15_000)
        ids = shown_request_ids(page)
        expected = [h["x-switchyard-request-id"] for h in reversed(earlier + later)]
        assert ids[:4] == expected, ids
        check_row(row(page, later[1]), later[1])
        page.locator("#decisions").screenshot(path=str(artifacts_dir / "decisions.png"))

        hostile_record_renders_as_text(page, stack)
        assert page.evaluate("window.__pwned") is None
        assert page.js_errors == []
    finally:
        page.context.close()


def check_row(locator, headers: httpx.Headers) -> None:
    """The row names the instance, reason and policy the response headers did, and
    highlights the chosen instance among its candidates with their scores."""
    cells = locator.locator("td")
    assert cells.nth(4).inner_text() == headers["x-switchyard-instance"]
    assert headers["x-switchyard-reason"] in cells.nth(5).inner_text()
    assert "lmetric" in cells.nth(3).inner_text()
    chosen = locator.locator(".cand.chosen")
    assert chosen.count() == 1
    assert chosen.get_attribute("data-candidate") == headers["x-switchyard-instance"]
    assert locator.locator(".cand").count() == 3  # every instance of the cluster, scored
    assert "pending prefill" in (chosen.get_attribute("title") or "")


def hostile_record_renders_as_text(page, stack: Stack) -> None:
    """Names in records are operator-controlled (router, arm, instance names) and anything
    that can write to Redis can write records: the page shows them as plain text."""
    record = DecisionRecord(
        cluster=stack.cluster.name,
        router=HOSTILE,
        request_id="hostile-1",
        at=9e9,
        arm=HOSTILE,
        policy=HOSTILE,
        instance=HOSTILE,
        reason=HOSTILE,
        hot_class=HOSTILE,
        details={"note": HOSTILE},
        tried=[HOSTILE],
        attempts=2,
        candidates=[CandidateScore(instance=HOSTILE, score=1.0)],
        candidates_total=1,
    )
    fields = record.to_stream_fields()
    stack.redis.xadd(decisions_stream(stack.cluster.name), fields)  # type: ignore[arg-type]  # stub: invariant dict
    hostile = page.locator("#decisions tbody tr[data-request='hostile-1']")
    hostile.wait_for(timeout=15_000)
    assert hostile.locator("td").nth(4).inner_text() == HOSTILE
    assert page.locator("#decisions img, [onerror]").count() == 0
