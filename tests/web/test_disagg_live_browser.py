"""A disaggregated cluster as operators see it, in chromium, end to end: an enginesim fleet
with roles (a prefill, two decode, one of both), a managed router that splits every
request (the decider set from the control plane), Redis, the publisher, Channels, the
page. The pools' columns, the split ratio and the failed KV transfers move with what the
router and the engines did."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import redis
from django.conf import settings

import engine_interface as ei
from controlplane.models import ConfigVersion, Instance
from controlplane.services import clusters
from devharness import Fleet
from devharness import control_plane as cp
from tests.fleets import fast_fleet

from .helpers import SYSTEM, login, make_cluster, page_snapshot, start_process
from .stack import Stack, chat, start_router, wait_for

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(240),
]

ROLES = {"i0": "prefill", "i1": "decode", "i2": "decode", "i3": "both"}


@pytest.fixture(scope="module")
def pd_fleet(tmp_path_factory) -> Iterator[Fleet]:
    log = tmp_path_factory.mktemp("fleet") / "enginesim.log"
    with fast_fleet(4, log=log, extra=["--roles", "prefill@0,decode@1-2"]) as fleet:
        yield fleet


@pytest.fixture
def pd_stack(pd_fleet, asgi_server, tmp_path) -> Iterator[Stack]:
    cluster = make_cluster([pd_fleet.url(k) for k in range(pd_fleet.size)])
    for instance in Instance.objects.filter(cluster=cluster, name__in=["i0", "i1", "i2"]):
        clusters.set_instance_role(SYSTEM, instance.pk, ROLES[instance.name], reason="pools")
    clusters.set_decider(SYSTEM, cluster.pk, "always", reason="split every request")
    version = ConfigVersion.objects.filter(cluster=cluster).order_by("-number")[0].number
    client = redis.Redis.from_url(settings.REDIS_URL)
    stack = Stack(cluster, [], client)
    try:
        stack.routers = [start_router(cluster, "r1", asgi_server.url, tmp_path)]
        stack.processes.append(start_process(cp.publisher_command(), tmp_path / "publisher.log"))
        stack.wait_reporting(version)
        yield stack
    finally:
        stack.close()
        client.close()


def cell(page, pool: str, field: str) -> str:
    return page.locator(f"#pool-live tr[data-pool={pool}] td[data-field={field}]").inner_text()


def disaggregation(page) -> dict:
    snapshot = page_snapshot(page) or {}
    return snapshot.get("disaggregation") or {}


def failed_read(fleet: Fleet) -> None:
    """A decode call whose blocks no prefill instance holds: the decode engine answers 500
    and counts a failed transfer (vllm:nixl_num_failed_transfers), as for a prefill
    instance that restarted between the two calls."""
    params = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": "0" * 32,
        "remote_request_id": "gone",
        "remote_block_ids": [1],
        "remote_host": "127.0.0.1",
        "remote_port": int(fleet.url(0).rsplit(":", 1)[1]),
    }
    body = {"prompt": "lost " * 20, "max_tokens": 2, "kv_transfer_params": params}
    reply = httpx.post(fleet.url(1) + "/v1/completions", json=body, timeout=30)
    assert reply.status_code == 500 and "KV transfer failed" in reply.text


def test_the_live_view_shows_the_pools_the_split_ratio_and_failed_transfers(
    browser, asgi_server, pd_fleet, pd_stack, artifacts_dir
) -> None:
    router = pd_stack.routers[0]
    page = login(browser, asgi_server.url, "viewer")
    try:
        page.goto(f"{asgi_server.url}/clusters/{pd_stack.cluster.pk}/")
        page.wait_for_selector("#conn[data-state=live]")
        page.wait_for_selector("#disagg-live:not(.hidden)", timeout=15_000)
        assert page.get_by_test_id("split-ratio").inner_text() == "–"  # nothing decided yet
        role_of = page.locator("#instances tr[data-instance=i0] td[data-field=role]")
        assert role_of.inner_text() == "prefill"
        assert cell(page, "prefill", "instances") == "2 / 2"  # i0 and i3
        assert cell(page, "decode", "instances") == "3 / 3"  # i1, i2 and i3
        failures_before = disaggregation(page).get("transfer_failures") or 0

        prompt = "Split me into a prefill and a decode, please. " * 40
        for n in range(4):
            reply = chat(router.url, f"{prompt} #{n}", max_tokens=16, stream=n % 2 == 1)
            assert reply.headers["x-switchyard-stage"] == "decode"
            assert reply.headers["x-switchyard-prefill-instance"] in ("i0", "i3")
        page.wait_for_function(
            "() => document.querySelector('[data-testid=split-counts]').textContent === '4 / 0'",
            timeout=15_000,
        )
        assert page.get_by_test_id("split-ratio").inner_text() == "100.0%"
        # the decode pool read the prompts' KV: a rate shows while the reads are recent
        wait_for(
            lambda: (disaggregation(page)["pools"]["decode"]["kv_bytes_per_s"] or 0) > 0,
            15,
            "the decode pool's KV read rate",
        )
        assert cell(page, "decode", "kv_bytes_per_s").endswith("B/s")
        assert cell(page, "decode", "kv_failed_transfers") == str(int(failures_before))

        failed_read(pd_fleet)
        expected = str(int(failures_before) + 1)
        page.wait_for_function(
            f"() => document.querySelector('[data-testid=transfer-failures]').textContent"
            f" === '{expected}'",
            timeout=15_000,
        )
        i1_failures = page.locator(
            "#instances tr[data-instance=i1] td[data-field=kv_failed_transfers]"
        )
        assert i1_failures.inner_text() == str(int(pd_fleet.metric(1, ei.NIXL_FAILED.total)))
        page.locator("#disagg-live").screenshot(path=str(artifacts_dir / "disagg-live.png"))
        assert page.js_errors == []
    finally:
        page.context.close()
