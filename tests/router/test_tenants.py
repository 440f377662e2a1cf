"""Tenants on a live router: the tenant from the client key, a header that may lower the
class but never raise it, the request's SLO headers checked, quotas answered 429 with
Retry-After, and flow control while the fleet is saturated: sheddable requests shed (503
with Retry-After), the others queued and released by class, the time queued counted in
TTFT, a tenant removed while its requests wait losing none of them."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devharness import Fleet, wait_until
from tests.router.client_keys import key_hash
from tests.router.helpers import MODEL, kv_fleet, router_config, scrape_total
from tests.router.test_tenants_quota import _fresh_minute

CRITICAL_KEY = "syk_critical_" + "c" * 40
BATCH_KEY = "syk_batchjob_" + "b" * 40
LIMITED_KEY = "syk_limited0_" + "l" * 40
TENANTS = [
    {"name": "oncall", "priority": "critical"},
    {"name": "batch", "priority": "sheddable"},
    {"name": "limited", "requests_per_minute": 2},
]
AUTH = {
    "required": False,
    "keys": [
        {"sha256": key_hash(CRITICAL_KEY), "tenant": "oncall"},
        {"sha256": key_hash(BATCH_KEY), "tenant": "batch"},
        {"sha256": key_hash(LIMITED_KEY), "tenant": "limited"},
    ],
}


def _config(fleet, **flow):
    document = router_config(fleet, "least_load", tenants=TENANTS, client_auth=AUTH)
    document["instances"] = fleet.instances()[:1]
    # on even when the tenants go away (a document without tenants turns it off by default)
    document["flow"] = {"enabled": True, "max_backlog_s": 0.001, **flow}
    return document


def _post(
    router,
    key: str | None = None,
    prompt: str = "hello " * 40,
    stream: bool = False,
    headers: dict[str, str] | None = None,
):
    headers = dict(headers or {})
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2, "stream": stream}
    return httpx.post(router.url + "/v1/completions", json=body, headers=headers, timeout=120)


def _flow(router, tenant: str, outcome: str, **labels: str) -> float:
    return scrape_total(
        router.url,
        "switchyard_router_flow_requests_total",
        tenant=tenant,
        outcome=outcome,
        **labels,
    )


HOSTILE_HEADERS = [
    ("x-switchyard-priority", "vip"),
    ("x-switchyard-priority", ""),
    ("x-slo-ttft-ms", "soon"),
    ("x-slo-ttft-ms", "-5"),
    ("x-slo-ttft-ms", "nan"),
    ("x-slo-tpot-ms", "inf"),
    ("x-slo-tpot-ms", "0"),
]


def test_hostile_flow_headers_get_a_400_naming_the_header(fleet, router_factory):
    router = router_factory(_config(fleet))
    for header, value in HOSTILE_HEADERS:
        answer = _post(router, headers={header: value})
        assert answer.status_code == 400, (header, value)
        assert answer.json()["error"]["param"] == header
    slo = {"x-slo-ttft-ms": "250", "x-slo-tpot-ms": "40.5"}
    assert _post(router, headers=slo).status_code == 200


def test_quota_is_429_with_retry_after_for_that_tenant_only(fleet, router_factory):
    router = router_factory(_config(fleet))
    _fresh_minute()  # the three requests count in one minute window
    assert [_post(router, LIMITED_KEY).status_code for _ in range(2)] == [200, 200]
    refused = _post(router, LIMITED_KEY)
    assert refused.status_code == 429 and "request rate" in refused.json()["error"]["message"]
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    assert _post(router).status_code == 200  # the default tenant is not limited
    assert _flow(router, "limited", "quota") == 1


@pytest.fixture
def logged_fleet(tmp_path) -> Iterator[tuple[Fleet, Path]]:
    """One instance of its own that logs each request's arrival (enginesim --request-log)."""
    log = tmp_path / "engine-requests.jsonl"
    with kv_fleet(1, "--request-log", str(log)) as started:
        yield started, log


def _engine_arrivals(log: Path) -> dict[str, float]:
    """Each request's arrival at the engine, by the client's X-Request-Id."""
    records = (json.loads(line) for line in log.read_text().splitlines() if line.strip())
    return {r["request_id"].removeprefix("cmpl-"): r["arrival"] for r in records}


def test_a_saturated_fleet_sheds_queues_by_class_and_serves_every_queued_request(
    logged_fleet, router_factory
):
    fleet, engine_log = logged_fleet
    router = router_factory(_config(fleet))
    answers: dict[str, httpx.Response] = {}
    finished: list[str] = []

    def send(name: str, key: str | None, **headers: str) -> threading.Thread:
        def run() -> None:
            # Streamed: the router measures a streamed request's TTFT.
            answers[name] = _post(
                router, key, f"{name} " * 200, True, headers | {"x-request-id": name}
            )
            finished.append(name)

        thread = threading.Thread(target=run)
        thread.start()
        return thread

    fleet.fault(0, "slow", factor=100_000)  # its prefill takes "forever": saturated
    try:
        threads = [send("hog", None, **{"x-slo-ttft-ms": "60000"})]
        wait_until(lambda: _flow(router, "default", "admitted") >= 1, 30, "the hog admitted")
        shed = _post(router, BATCH_KEY)
        lowered = _post(router, CRITICAL_KEY, headers={"x-switchyard-priority": "sheddable"})
        threads.append(send("standard", None))
        wait_until(lambda: _flow(router, "default", "queued") >= 1, 30, "standard queued")
        threads.append(send("critical", CRITICAL_KEY, **{"x-switchyard-priority": "critical"}))
        wait_until(lambda: _flow(router, "oncall", "queued") >= 1, 30, "critical queued")
        queued = scrape_total(router.url, "switchyard_router_flow_queued")
        # The tenants go away while their requests wait: none of them is lost.
        document = _config(fleet)
        document["tenants"], document["client_auth"] = [], {"required": False, "keys": []}
        applied = httpx.post(
            router.url + "/admin/config", json=document, headers=router.admin_headers, timeout=10
        )
        assert applied.status_code == 200, applied.text
        time.sleep(1.0)  # the queued requests wait at least this long: it shows in their TTFT
    finally:
        fleet.fault(0, "recover")
        # A request wakes the engine's driver from the sleep it began at the slow rate.
        wake = {"model": MODEL, "prompt": "wake", "max_tokens": 1}
        httpx.post(fleet.url(0) + "/v1/completions", json=wake, timeout=60)
    for thread in threads:
        thread.join(timeout=120)
    for refused in (shed, lowered):
        assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
        assert "shed" in refused.json()["error"]["message"]
    assert queued == 2
    assert {name: a.status_code for name, a in answers.items()} == dict.fromkeys(
        ("hog", "standard", "critical"), 200
    )
    # Released by class: the critical request reached the engine first, though it came last.
    # (The order the two answers ended in is a race: both decode on one engine together.)
    wanted = {"critical", "standard"}
    wait_until(
        lambda: _engine_arrivals(engine_log).keys() >= wanted,
        10,
        "both requests in the engine's request log",
    )
    arrivals = _engine_arrivals(engine_log)
    assert arrivals["critical"] < arrivals["standard"]
    assert set(finished) == {"hog", "standard", "critical"}
    assert _flow(router, "batch", "shed") == 1 and _flow(router, "oncall", "shed") == 1
    assert _flow(router, "oncall", "released") == _flow(router, "default", "released") == 1
    ttft = scrape_total(router.url, "switchyard_router_tenant_ttft_seconds_sum", tenant="oncall")
    assert ttft >= 1.0


def test_the_tpot_leg_reads_the_engines_step_time_and_lowers_the_bound(fleet, router_factory):
    # The live chain of the TPOT leg: the engine's /metrics (its inter-token latency), the
    # router's scrape, the flow gate's load, the controller's bound, exported. A 1 ms TPOT
    # SLO is over any engine's step time: once tokens were made and scraped, the bound
    # falls below max_backlog_s.
    router = router_factory(_config(fleet, max_backlog_s=5.0, tpot_slo_s=0.001))
    bound = "switchyard_router_flow_backlog_bound_seconds"

    def decoded_and_lowered() -> bool:
        body = {"model": MODEL, "prompt": "hello " * 40, "max_tokens": 16}
        httpx.post(router.url + "/v1/completions", json=body, timeout=120)
        return scrape_total(router.url, bound) < 5.0

    wait_until(decoded_and_lowered, 60, "the bound lowered by the engines' step time")
    # Exported too: NaN when the last interval read had no token (the requests are short).
    step = scrape_total(router.url, "switchyard_router_flow_step_seconds")
    assert step != step or step > 0.001
