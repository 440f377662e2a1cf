"""Canaries with the demo's defaults reach their verdict with nobody at the controls.

The stack runs as `make demo` runs it, smaller: an enginesim fleet, a router per cluster,
the control plane under uvicorn and a Celery worker with beat (ingest, rollups, the judge
every 10 s), all with the demo's canary defaults (SWITCHYARD_CANARY_DEFAULTS). An operator
creates two canaries in chromium, leaving every guardrail and the weight steps as the form
offers them, and starts them. Clients keep sending streamed chats. On one cluster the
candidate arm is the faster one (the baseline arm's engines run slowed), so the judge
passes it through every step and promotes it; on the other the candidate's engines run
slowed, so every step fails and the judge rolls it back. Neither needs a click after
"start".
"""

from __future__ import annotations

import ast
import itertools
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from controlplane.models import CanarySplit
from devharness import Fleet, free_port, stop_process
from devharness import control_plane as cp
from devharness import start_process as harness_start

from .helpers import ROOT, login, make_cluster, start_asgi, subprocess_env
from .stack import chat, start_router, wait_for

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(420),
]
SLOW_FACTOR = 3  # the slowed arm's engines: TTFT and TPOT about three times the other's


def demo_canary_defaults() -> str:
    """The canary defaults `make demo` runs with, read from the demo script itself."""
    tree = ast.parse((ROOT / "scripts" / "demo.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "DEMO_CANARY_DEFAULTS" for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise AssertionError("scripts/demo.py sets no DEMO_CANARY_DEFAULTS")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Iterator[Fleet]:
    # Real time: the slowed arm's extra tens of milliseconds stand well clear of the noise.
    log = tmp_path_factory.mktemp("fleet") / "enginesim.log"
    with Fleet(8, log=log) as fleet:
        yield fleet


@pytest.fixture
def demo_env() -> dict[str, str]:
    return {**subprocess_env(), "SWITCHYARD_CANARY_DEFAULTS": demo_canary_defaults()}


@pytest.fixture
def control_plane(transactional_db, demo_env, tmp_path):
    server = start_asgi(free_port(), tmp_path / "uvicorn.log", env=demo_env)
    yield server
    stop_process(server.process)


@pytest.fixture
def celery_worker_with_beat(transactional_db, demo_env, tmp_path):
    """The demo's general worker and beat in one process (the judge, ingest, rollups)."""
    args = cp.worker_command(
        "default",
        f"canary-demo-{free_port()}",
        solo=True,
        beat_schedule=tmp_path / "beat-schedule",
        log_level="WARNING",
    )
    log = tmp_path / "celery.log"
    process = harness_start(args, cwd=ROOT, env=demo_env, log=log, stdin=None)
    yield log
    stop_process(process)


def slow(fleet: Fleet, index: int) -> None:
    response = httpx.post(
        fleet.url(index) + "/admin/fault", json={"mode": "slow", "factor": SLOW_FACTOR}
    )
    response.raise_for_status()


def keep_sending(router_url: str, stop: threading.Event, served: list[int]) -> None:
    """Streamed chats back to back, without a session key (each goes to a random arm)."""
    for n in itertools.count():
        if stop.is_set():
            return
        try:
            response = chat(
                router_url, f"canary {n}: " + "switch yards " * (4 + n % 9), stream=True
            )
            served.append(response.status_code)
        except httpx.HTTPError:
            served.append(0)


def create_and_start(page, base_url: str, cluster_id: int, name: str) -> None:
    """Through the form, leaving the weight steps and every guardrail at their defaults."""
    page.goto(f"{base_url}/clusters/{cluster_id}/canary/")
    page.fill("#canary-form input[name=name]", name)
    page.fill("#canary-form [name=reason]", "try round robin")
    page.click("#canary-form button.primary")
    row = page.locator(f"tr[data-canary='{name}']")
    row.wait_for()
    row.locator("input[name=reason]").fill("go")
    row.locator("button[data-action=start]").click()
    page.locator(f"tr[data-canary='{name}'] [data-testid=canary-state]").filter(
        has_text="progressing"
    ).wait_for()


def test_demo_defaults_promote_a_better_candidate_and_roll_back_a_worse_one(
    browser, fleet, control_plane, celery_worker_with_beat, tmp_path, artifacts_dir
) -> None:
    # Instances i0..i3 of each cluster; the form puts even ones in the baseline arm.
    better = make_cluster([fleet.url(k) for k in range(4)], name="canary-better")
    worse = make_cluster([fleet.url(k) for k in range(4, 8)], name="canary-worse")
    for index in (0, 2, 5, 7):  # better's baseline arm, worse's candidate arm
        slow(fleet, index)
    routers = [start_router(c, "r0", control_plane.url, tmp_path) for c in (better, worse)]
    stop, served = threading.Event(), list[int]()
    senders = [
        threading.Thread(target=keep_sending, args=(r.url, stop, served), daemon=True)
        for r in routers
        for _ in range(2)
    ]
    page = login(browser, control_plane.url, "operator")
    page.on("dialog", lambda dialog: dialog.accept())
    try:
        wait_for(lambda: httpx.get(routers[1].url + "/health").status_code == 200, 30, "routers")
        for sender in senders:
            sender.start()
        create_and_start(page, control_plane.url, better.pk, "rr-better")
        create_and_start(page, control_plane.url, worse.pk, "rr-worse")
        promoted = CanarySplit.objects.get(name="rr-better")
        rolled_back = CanarySplit.objects.get(name="rr-worse")
        schedule = json.loads(demo_canary_defaults())
        steps = [float(s) for s in schedule["weight_steps"]]
        assert promoted.weight_steps == steps
        assert promoted.guardrails["min_samples"] == schedule["min_samples"]

        page.goto(f"{control_plane.url}/clusters/{worse.pk}/canary/{rolled_back.pk}/")
        page.wait_for_selector("#canary-timeline[data-state=rolled_back]", timeout=300_000)
        rows = page.locator("[data-testid=judgements] tr[data-judgement]")
        actions = [rows.nth(i).get_attribute("data-action") for i in range(rows.count())]
        assert actions.count("retry") == 2 and actions[0] == "rollback", actions
        page.screenshot(path=str(artifacts_dir / "canary-rolled-back.png"), full_page=True)

        page.goto(f"{control_plane.url}/clusters/{better.pk}/canary/{promoted.pk}/")
        page.wait_for_selector("#canary-timeline[data-state=promoted]", timeout=120_000)
        assert page.locator("tr[data-action=advance]").count() == len(steps) - 1
        promoted_at = page.locator("tr[data-action=promote] [data-field=step]").inner_text()
        assert promoted_at == f"{len(steps)} · {steps[-1]:g}%"
        assert page.locator("tr[data-action=pause]").count() == 0
        better.refresh_from_db()
        assert better.active_policy is not None
        assert better.active_policy.name == "rr"  # the promoted candidate now serves it all
        assert page.js_errors == []
    finally:
        stop.set()
        for sender in senders:
            sender.join(timeout=60)
        for router in routers:
            stop_process(router.process)
        page.context.close()
    assert served and served.count(200) >= 0.95 * len(served), served[-20:]
    log = Path(celery_worker_with_beat).read_text()
    assert "could not be judged" not in log, log[-3000:]
