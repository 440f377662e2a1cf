"""End to end in Debian chromium: enginesim fleet → managed routers → Redis → publisher →
Channels → the browser, with the control plane served by uvicorn on the test database."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest
import redis
from django.conf import settings

from controlplane.realtime.snapshot import merge_cluster
from devharness import control_plane as cp
from router_worker.contract.telemetry import StateSnapshot
from tests.fleets import fast_fleet

from .helpers import login, make_cluster, page_snapshot, start_process
from .stack import Stack, chat, start_router, wait_for

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(180),
]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    log = tmp_path_factory.mktemp("fleet") / "enginesim.log"
    with fast_fleet(3, log=log) as fleet:
        yield fleet


@pytest.fixture
def stack(fleet, asgi_server, tmp_path) -> Iterator[Stack]:
    cluster = make_cluster([fleet.url(k) for k in range(fleet.size)])
    client = redis.Redis.from_url(settings.REDIS_URL)
    stack = Stack(cluster, [], client)
    try:
        stack.routers = [
            start_router(cluster, name, asgi_server.url, tmp_path) for name in ("r1", "r2")
        ]
        stack.processes.append(start_process(cp.publisher_command(), tmp_path / "publisher.log"))
        stack.wait_reporting(1)
        yield stack
    finally:
        stack.close()
        client.close()


def send_traffic(stack: Stack, requests: int) -> threading.Thread:
    def run() -> None:
        for n in range(requests):
            router = stack.routers[n % len(stack.routers)]
            chat(
                router.url,
                f"request {n}: " + "tell me about switchyards " * (5 + n % 7),
                max_tokens=16,
                stream=True,
            )

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_live_view_follows_the_routers_and_raises_hotspot_alerts(
    browser, asgi_server, stack, artifacts_dir
) -> None:
    page = login(browser, asgi_server.url, "viewer")
    try:
        page.goto(f"{asgi_server.url}/clusters/{stack.cluster.pk}/")
        page.wait_for_selector("#conn[data-state=live]")
        page.wait_for_selector("[data-router=r1]")
        assert (page_snapshot(page) or {}).get("window", {}).get("requests", 0) == 0
        traffic = send_traffic(stack, 24)
        wait_for(
            lambda: page_snapshot(page)["window"]["requests"] > 0,
            30,
            "the page to show requests while traffic flows",
        )
        traffic.join(timeout=60)
        assert not traffic.is_alive()
        expected = wait_for(
            lambda: _settled(stack, page), 15, "the page to match the routers' /admin/state"
        )
        assert expected["window"]["requests"] == 24, expected
        metric = page.locator("[data-metric=ttft_p50_s]").inner_text()
        assert metric.endswith("ms"), json.dumps(expected["window"])
        page.screenshot(path=str(artifacts_dir / "cluster-live.png"), full_page=True)
        hotspot_burst_raises_the_banner_and_reaches_the_audit_log(
            page, stack, asgi_server, artifacts_dir
        )
        assert page.js_errors == []
    finally:
        page.context.close()


def hotspot_burst_raises_the_banner_and_reaches_the_audit_log(
    page, stack, asgi_server, artifacts_dir
) -> None:
    from controlplane.services import ingest

    _hotspot_burst(stack)
    banner = page.locator("[data-testid=hotspot-banner]")
    banner.wait_for(state="visible", timeout=30_000)
    assert "Hotspot confirmed" in banner.inner_text() and "x/x̄" in banner.inner_text()
    page.screenshot(path=str(artifacts_dir / "hotspot-alert.png"), full_page=True)
    wait_for(
        lambda: (
            ingest.ingest_events(stack.redis)
            and stack.cluster.hotspots.filter(transition="confirmed").exists()
        ),
        15,
        "the confirmed hotspot to be ingested",
    )
    page.goto(f"{asgi_server.url}/hotspots/?cluster={stack.cluster.pk}")
    assert page.locator("tr[data-transition=confirmed]").count() >= 1
    page.screenshot(path=str(artifacts_dir / "hotspot-log.png"), full_page=True)


def _settled(stack: Stack, page) -> dict | None:
    """The routers' own state merged, when the page shows the same numbers."""
    snapshots = [StateSnapshot.model_validate(r.state()["snapshot"]) for r in stack.routers]
    expected = merge_cluster(stack.cluster.name, snapshots)
    shown = page_snapshot(page)
    keys = ("requests", "errors", "output_tokens_per_s", "ttft_p99_s", "tpot_p99_s")
    same_window = all(
        shown["window"][k] == pytest.approx(expected["window"][k])
        for k in keys
        if expected["window"][k] is not None
    )
    same_instances = [(i["name"], i["health"]) for i in shown["instances"]] == [
        (i["name"], i["health"]) for i in expected["instances"]
    ]
    return expected if same_window and same_instances else None


def test_operator_switches_the_policy(browser, asgi_server, stack, artifacts_dir) -> None:
    page = login(browser, asgi_server.url, "operator")
    try:
        page.goto(f"{asgi_server.url}/clusters/{stack.cluster.pk}/policy/")
        page.select_option("[data-testid=policy-choice]", label="rr (round_robin)")
        page.fill("[data-testid=reason]", "spread load evenly for the test")
        page.check("[data-testid=confirm]")
        page.click("[data-testid=apply]")
        page.wait_for_selector("[data-testid=applied]")
        stack.wait_reporting(2)
        for router in stack.routers:
            page.wait_for_selector(f"tr[data-router={router.name}][data-version='2']")
        page.screenshot(path=str(artifacts_dir / "policy-control.png"), full_page=True)
    finally:
        page.context.close()
    for router in stack.routers:
        response = chat(router.url, "which policy routes me?", max_tokens=2)
        assert response.headers["x-switchyard-policy"] == "round_robin"


def test_operator_overrides_grey_failure_detection(browser, asgi_server, stack) -> None:
    """The live view's override: forcing i1 drained reaches both routers (their detectors
    drain it: the instances table's badge says so), the audit log has the row with the
    reason, and automatic hands it back to the detector; a bad value is refused with the
    service's message."""
    page = login(browser, asgi_server.url, "operator")
    live = f"{asgi_server.url}/clusters/{stack.cluster.pk}/"
    badge = "tr[data-instance=i1] [data-testid=grey-badge]"
    try:
        page.goto(live)
        page.wait_for_selector("#conn[data-state=live]")
        assert page.locator(badge).count() == 0
        _override(page, "i1", "drained", "i1 answers slowly since its host was moved")
        assert (
            "forced drained"
            in page.locator("[data-testid=grey-overrides] tr[data-instance=i1]").inner_text()
        )
        stack.wait_reporting(2)
        page.wait_for_selector(f"{badge}:has-text('drained')")
        for router in stack.routers:  # the routers' own word, not the page's
            shown = next(i for i in router.state()["snapshot"]["instances"] if i["name"] == "i1")
            assert shown["grey_level"] == 3
        _override(page, "i1", "auto", "host fixed")
        stack.wait_reporting(3)
        page.wait_for_selector(badge, state="detached")
        _override(page, "i1", "auto", "once more")  # refused on the page, with the reason
        error = page.locator("[data-testid=grey-error]").inner_text()
        assert "'i1' already has grey override auto" in error

        page.goto(f"{asgi_server.url}/audit/?action=instance.grey_override")
        rows = page.locator("tr[data-action='instance.grey_override']")
        assert rows.count() == 2
        assert "i1 answers slowly since its host was moved" in rows.nth(1).inner_text()
        assert (
            '"grey_override": "drained"' in rows.nth(1).locator("[data-field=after]").inner_text()
        )

        token = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
        headers = {"X-CSRFToken": token, "Referer": live}
        url = f"{live}grey-override/"
        for form, status, message in (
            ({"instance": "i1", "mode": "sideways", "reason": "x"}, 400, "must be one of"),
            ({"instance": "i1", "mode": "drained", "reason": " "}, 400, "a reason is required"),
            ({"instance": "nope", "mode": "drained", "reason": "x"}, 400, "not in this cluster"),
            ({"instance": "i1", "mode": "auto", "reason": "x"}, 409, "already has grey"),
        ):
            response = page.request.post(url, form=form, headers=headers)
            assert response.status == status, form
            assert message in response.text(), form
    finally:
        page.context.close()
    assert page.js_errors == []


def _override(page, instance: str, mode: str, reason: str) -> None:
    page.select_option("[data-testid=grey-instance]", instance)
    page.select_option("[data-testid=grey-mode]", mode)
    page.fill("[data-testid=grey-reason]", reason)
    page.click("[data-testid=grey-apply]")
    page.wait_for_selector("#conn[data-state=live]")


def _hotspot_burst(stack: Stack) -> None:
    """Many requests sharing one long prefix, one at a time, so LMetric keeps them on the
    instance that caches it while the class dominates the window."""
    prefix = "You are the switchyard assistant. " * 120
    router = stack.routers[0]
    for n in range(40):
        chat(router.url, f"{prefix} question {n}", max_tokens=2)


def test_operator_captures_the_clusters_traffic_and_replays_it(
    browser, asgi_server, stack, artifacts_dir, settings, tmp_path
) -> None:
    """Capture → traffic through both routers → the capture fills → stop → replay it."""
    from controlplane.models import ReplayJob, TrafficCapture
    from controlplane.services import captures, ingest
    from controlplane.tasks.replay import run_replay

    settings.SWITCHYARD_VAR_DIR = str(tmp_path / "var")
    page = login(browser, asgi_server.url, "operator")
    base = f"{asgi_server.url}/clusters/{stack.cluster.pk}"
    try:
        page.goto(f"{base}/captures/")
        page.get_by_test_id("capture-idle").wait_for()
        page.fill("input[name=name]", "e2e traffic")
        page.fill("input[name=max_requests]", "1000")
        page.click("[data-action=start-capture]")
        page.get_by_test_id("capture-running").wait_for()
        stack.wait_reporting(2)  # the routers run the config carrying the capture
        send_traffic(stack, 12).join(60)

        def ingested() -> int:
            ingest.ingest_captures(stack.redis)
            return TrafficCapture.objects.get().requests

        wait_for(lambda: ingested() == 12, 20, "twelve captured requests")
        page.wait_for_selector("[data-testid=running-requests]:text('12')")
        page.goto(f"{base}/")
        page.get_by_test_id("capture-banner").wait_for()
        page.goto(f"{base}/captures/")
        page.click("[data-action=stop]")
        page.wait_for_selector("[data-testid=capture-state]:text('stopped')")
        stack.wait_reporting(3)
        page.screenshot(path=str(artifacts_dir / "capture.png"), full_page=True)

        page.click("[data-action=replay]")
        capture = TrafficCapture.objects.get()
        assert page.locator("select[name=trace]").input_value() == capture.trace
        page.click("[data-testid=replay-controls] button.primary")
        page.wait_for_url(f"{base}/replays/*/**")
        job = ReplayJob.objects.get()
        assert job.inputs["trace"] == capture.trace
        assert run_replay(job.pk) == "succeeded"
        page.reload()
        page.wait_for_selector("text=succeeded")
        assert page.js_errors == []
    finally:
        page.context.close()
    rows = list(captures.export_lines(TrafficCapture.objects.get()))
    assert len(rows) == 12
    assert {json.loads(row)["router"] for row in rows} == {r.name for r in stack.routers}
