"""The pages in Debian chromium against uvicorn: viewer restrictions, the stale state and
reconnection of the live view, and screenshots of the main pages for the README."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import redis
from django.conf import settings
from django.utils import timezone
from playwright.sync_api import expect

from controlplane.models import ArmMetricRollup, CanaryJudgement, Cluster, ReplayJob
from controlplane.services import canaries
from controlplane.tasks.replay import run_replay
from devharness import stop_process
from router_worker.contract.telemetry import ClassLane, TenantLane

from .helpers import (
    SYSTEM,
    clear_state,
    instance,
    login,
    make_cluster,
    page_snapshot,
    snapshot,
    start_asgi,
    window,
    write_state,
)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(120),
]


class Feeder:
    """Writes router-like snapshots every 250 ms, as a live router would."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.client = redis.Redis.from_url(settings.REDIS_URL)
        self.pending = 1234.0
        self.tier = False  # the engines report a global KV tier
        self.lanes: dict[str, dict[str, TenantLane]] = {}  # router -> its tenants' lanes
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        tick = 0
        while not self.stopped.wait(0.25):
            tick += 1
            instances = [
                instance(
                    f"i{k}",
                    pending=self.pending * (k + 1),
                    batch=4 + k,
                    pending_max=self.pending * (k + 1) + tick % 7,
                    in_flight=k,
                    kv_usage=0.2 * (k + 1),
                    hit_ratio=0.6,
                    preemptions=1500.0 * k,
                    silent_fallback=k == 2,
                    grey_level=3 if k == 2 else 0,
                    grey_excess=2.5 if k == 2 else 1.0,
                    **self._tier(k),
                )
                for k in range(3)
            ]
            write_state(
                self.client,
                snapshot(
                    self.cluster.name,
                    "r1",
                    instances,
                    window=window(
                        120,
                        ttft_p50_s=0.042,
                        ttft_p99_s=0.180 + 0.01 * (tick % 5),
                        tpot_p50_s=0.011,
                        tpot_p99_s=0.030,
                        hit_ratio=0.62,
                        load_cv=0.4,
                    ),
                    tenants=self.lanes.get("r1", {}),
                ),
            )
            for router, lanes in self.lanes.items():
                if router != "r1":
                    write_state(
                        self.client,
                        snapshot(self.cluster.name, router, instances, tenants=lanes),
                    )

    def _tier(self, k: int) -> dict[str, float]:
        if not self.tier:
            return {}
        return {"tier_hit_tokens": 1000.0 * (k + 1), "tier_bytes_read": 57_344_000.0 * (k + 1)}

    def __enter__(self) -> Feeder:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join(timeout=5)
        clear_state(self.client, self.cluster.name)
        self.client.close()


@pytest.fixture
def live_cluster(transactional_db) -> Cluster:
    return make_cluster()


@pytest.fixture
def feeder(live_cluster, publisher) -> Iterator[Feeder]:
    with Feeder(live_cluster) as running:
        yield running


def test_viewer_sees_no_controls_and_a_forged_post_is_refused(browser, asgi_server) -> None:
    cluster = make_cluster()
    page = login(browser, asgi_server.url, "viewer")
    try:
        for path in ("policy", "canary", "replays"):
            page.goto(f"{asgi_server.url}/clusters/{cluster.pk}/{path}/")
            assert page.locator("[data-testid=role]").text_content() == "viewer"
            assert page.locator("main form[method=post]").count() == 0, path
        token = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
        rr = cluster.policies.get(name="rr")
        response = page.request.post(
            f"{asgi_server.url}/clusters/{cluster.pk}/policy/apply/",
            form={"policy": str(rr.pk), "reason": "forged", "confirm": "yes"},
            headers={"X-CSRFToken": token, "Referer": f"{asgi_server.url}/"},
        )
        assert response.status == 403
    finally:
        page.context.close()
    cluster.refresh_from_db()
    assert cluster.active_policy is not None and cluster.active_policy.name == "lm"


def test_live_view_goes_stale_when_disconnected_and_reconnects(
    browser, live_cluster, feeder, own_asgi_server, tmp_path
) -> None:
    asgi_server = own_asgi_server
    page = login(browser, asgi_server.url, "viewer")
    try:
        page.goto(f"{asgi_server.url}/clusters/{live_cluster.pk}/")
        page.wait_for_selector("#conn[data-state=live]")
        page.wait_for_function("window.switchyardLive.messages > 2")
        shown = page_snapshot(page)
        assert [i["pending_prefill_tokens"] for i in shown["instances"]] == [1234, 2468, 3702]
        assert (
            page.locator("tr[data-instance=i1] [data-field=pending_prefill_tokens]").inner_text()
            == "2,468"
        )
        assert page.locator("tr[data-instance=i2] [data-field=preemptions]").inner_text() == "3,000"
        assert page.locator("tr[data-instance=i2] [data-field=silent_fallback]").is_visible()
        assert page.locator("tr[data-instance=i1] [data-field=silent_fallback]").count() == 0
        fallback = page.locator("[data-testid=fallback-banner]")
        assert fallback.is_visible() and "on i2:" in fallback.inner_text()
        slow = page.locator("tr[data-instance=i2] [data-field=grey_excess]").inner_text()
        assert slow == "2.50 drained"
        assert page.locator("tr[data-instance=i1] [data-field=grey_excess]").inner_text() == "1.00"
        port = int(asgi_server.url.rsplit(":", 1)[1])
        stop_process(asgi_server.process)
        page.wait_for_selector("#conn[data-state=stale]", timeout=10_000)
        feeder.pending = 99.0
        asgi_server.process = start_asgi(port, tmp_path / "uvicorn-2.log").process
        page.wait_for_selector("#conn[data-state=live]", timeout=30_000)
        page.wait_for_function(
            "window.switchyardLive.state.snapshot.instances[0].pending_prefill_tokens === 99",
            timeout=10_000,
        )
    finally:
        page.context.close()


def test_sorting_the_instance_table(browser, live_cluster, feeder, asgi_server) -> None:
    page = login(browser, asgi_server.url, "viewer")
    try:
        page.goto(f"{asgi_server.url}/clusters/{live_cluster.pk}/")
        page.wait_for_selector("tr[data-instance=i2]")
        page.click("th[data-sort=pending_prefill_tokens]")
        page.click("th[data-sort=pending_prefill_tokens]")  # second click: descending
        names = page.locator("#instances tbody tr").evaluate_all(
            "rows => rows.map(r => r.dataset.instance)"
        )
        assert names == ["i2", "i1", "i0"]
    finally:
        page.context.close()


def test_tenant_lanes_merge_the_routers_windows_with_sheds_and_classes(
    browser, live_cluster, feeder, asgi_server
) -> None:
    def lane(admitted: int, refused: int, shed: int, **classes: ClassLane) -> TenantLane:
        return TenantLane(
            priority="standard",
            weight=1.0,
            requests=sum(c.requests for c in classes.values()),
            admitted=admitted,
            queued=0,
            refused=refused,
            shed=shed,
            served_tokens=1000.0,
            ttft_p50_s=0.2,
            classes=classes,
        )

    feeder.lanes = {
        "r1": {
            "team-a": lane(
                3,
                2,
                1,
                standard=ClassLane(requests=1, ttft_p50_s=0.1),
                sheddable=ClassLane(requests=2, ttft_p50_s=4.0),
            )
        },
        "r2": {"team-a": lane(4, 2, 2, standard=ClassLane(requests=3, ttft_p50_s=0.3))},
    }
    page = login(browser, asgi_server.url, "viewer")
    try:
        page.goto(f"{asgi_server.url}/clusters/{live_cluster.pk}/")
        row = page.locator("#tenant-lanes tr[data-tenant=team-a]")
        expect(row.locator("[data-field=admitted]")).to_have_text("7")
        expect(row.locator("[data-field=refused]")).to_have_text("4")
        expect(row.locator("[data-field=shed]")).to_have_text("3")
        ttft = row.locator("[data-field=ttft_p50_s]")
        expect(ttft.locator("[data-class=standard]")).to_have_text("standard 250 ms")  # by requests
        expect(ttft.locator("[data-class=sheddable]")).to_have_text("sheddable 4000 ms")
        expect(page.get_by_test_id("tenant-lanes")).to_contain_text("last window")
        assert page.js_errors == []
    finally:
        page.context.close()


def test_tier_traffic_shows_only_when_the_cluster_has_a_tier(
    browser, live_cluster, feeder, asgi_server
) -> None:
    page = login(browser, asgi_server.url, "viewer")
    try:
        page.goto(f"{asgi_server.url}/clusters/{live_cluster.pk}/")
        page.wait_for_selector("tr[data-instance=i2]")
        assert not page.is_visible("[data-testid=tier-hit-tokens]")
        assert not page.is_visible("tr[data-instance=i0] [data-field=tier_hit_tokens]")
        feeder.tier = True
        page.wait_for_selector("[data-testid=tier-hit-tokens]", state="visible")
        assert page.inner_text("[data-testid=tier-hit-tokens]") == "6,000"
        assert page.inner_text("[data-testid=tier-bytes]") == "344.1 MB"
        cell = "tr[data-instance=i1] [data-field=tier_hit_tokens]"
        assert page.is_visible(cell) and page.inner_text(cell) == "2,000"
        feeder.tier = False
        page.wait_for_selector("[data-testid=tier-hit-tokens]", state="hidden")
    finally:
        page.context.close()


def seed_pages(cluster: Cluster) -> None:
    """A running canary with judgements and samples, a finished replay, audit rows."""
    assert cluster.active_policy_id is not None
    canary = canaries.create_canary(
        SYSTEM,
        cluster.pk,
        name="lm-vs-rr",
        baseline_policy_id=cluster.active_policy_id,
        candidate_policy_id=cluster.policies.get(name="rr").pk,
        baseline_instances=["i0", "i1"],
        candidate_instances=["i2"],
        weight_steps=[10, 25, 50],
        reason="compare rr",
    )
    canaries.transition(SYSTEM, canary.pk, "start", reason="go")
    minute = timezone.now().replace(second=0, microsecond=0)
    for arm, scale in (("baseline", 1.0), ("candidate", 1.3)):
        ArmMetricRollup.objects.create(
            cluster=cluster,
            arm=arm,
            minute=minute,
            requests=200,
            ttft_samples=[scale * (0.03 + 0.001 * (n % 40)) for n in range(200)],
            tpot_samples=[scale * (0.010 + 0.0001 * (n % 30)) for n in range(200)],
        )
    CanaryJudgement.objects.create(
        canary=canary,
        step_index=0,
        verdict="inconclusive",
        action="wait",
        evidence={"n": [120, 14], "p": 0.21},
    )
    job = ReplayJob.objects.create(
        cluster=cluster,
        inputs={
            "trace": "shared:mooncake_synthetic_trace.jsonl",
            "rate_scale": 1.0,
            "max_requests": 150,
            "seed": 0,
            "policies": [
                {"kind": "lmetric", "params": {}},
                {"kind": "round_robin", "params": {}},
                {"kind": "cache_aware", "params": {}},
            ],
        },
    )
    assert run_replay(job.pk) == "succeeded"


def test_screenshots_of_the_main_pages(
    browser, live_cluster, feeder, asgi_server, artifacts_dir
) -> None:
    seed_pages(live_cluster)
    page = login(browser, asgi_server.url, "operator")
    base = f"{asgi_server.url}/clusters/{live_cluster.pk}"
    shots = {
        "clusters": f"{asgi_server.url}/",
        "canary": f"{base}/canary/",
        "replays": f"{base}/replays/",
        "audit-log": f"{asgi_server.url}/audit/",
    }
    try:
        for name, url in shots.items():
            page.goto(url)
            page.wait_for_load_state("networkidle")
            page.screenshot(path=str(artifacts_dir / f"{name}.png"), full_page=True)
        page.goto(f"{base}/policy/")
        page.select_option("[data-testid=policy-choice]", "new")
        page.select_option("[data-testid=policy-kind]", "cache_aware")
        page.wait_for_selector("input[name='param.cache_threshold']")
        page.screenshot(path=str(artifacts_dir / "policy-form.png"), full_page=True)
        page.goto(f"{base}/replays/{live_cluster.replays.get().pk}/")
        page.wait_for_selector("#replay-plot canvas")
        page.screenshot(path=str(artifacts_dir / "replay-result.png"), full_page=True)
        page.goto(f"{base}/canary/")
        page.wait_for_selector("[data-testid=comparison] tr[data-arm=candidate]")
        page.screenshot(path=str(artifacts_dir / "canary.png"), full_page=True)
        page.goto(f"{base}/")
        page.wait_for_function("window.switchyardLive.messages > 8")
        time.sleep(0.3)
        page.screenshot(path=str(artifacts_dir / "cluster-live-synthetic.png"), full_page=True)
        page.goto(f"{base}/?at={time.time() - 60:.0f}")  # the hotspot log's "cluster then"
        page.wait_for_selector("#conn[data-state=history]")
        page.wait_for_selector("#chart-ttft canvas")
        assert page.js_errors == []
    finally:
        page.context.close()
    page = browser.new_page()
    try:
        page.goto(f"{asgi_server.url}/login/")
        page.screenshot(path=str(artifacts_dir / "login.png"))
    finally:
        page.close()
