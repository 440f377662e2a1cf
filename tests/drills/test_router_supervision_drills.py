"""Drills for router supervision and concurrent edits, on a private control-plane stack
(tests/drills/stack.py: its own Postgres cluster, redis-server, uvicorn, a Celery `routers`
worker supervising one router, and here also the general worker and beat, so reconcile runs
every 5 s as in production).

* control plane (uvicorn) down 35 s with beat running: no healthy router restarted, no
  stream cut;
* Postgres down 35 s with reconcile running (the stack's private cluster is stopped; the
  machine's shared Postgres is never touched): no restart during or after the outage;
* the routers worker SIGKILLed: its router follows it within seconds (no orphan serving a
  stale config), and a new worker starts a fresh one;
* two operators racing config edits with the revision they saw: exactly one edit per round
  wins, the other gets 409 with the current revision; every accepted edit is audited.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from devharness import Fleet, wait_until
from tests.drills.clients import BackgroundLoad, Load
from tests.drills.report import Outcome, record
from tests.drills.stack import Stack, build_stack

OUTAGE_S = 35.0
# Reconcile's heartbeat timeout (15 s) plus a beat period and a margin: long enough after an
# outage for a wrong restart to have happened.
SETTLE_S = 25.0
ORPHAN_EXIT_BOUND_S = 20.0
RACE_ROUNDS = 10
SECOND_OPERATOR = """
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from controlplane.services import tokens
from controlplane.services.audit import Actor
user = get_user_model().objects.create_user("drill-op-2")
user.groups.add(Group.objects.get_or_create(name="operator")[0])
print("TOKEN" + tokens.create_api_token(Actor.system("drills"), user, "race")[0])
"""


@pytest.fixture(scope="module")
def stack(drill_fleet: Fleet) -> Iterator[Stack]:
    if not os.path.exists("/usr/lib/postgresql/15/bin/initdb"):
        pytest.fail("PostgreSQL 15 server binaries are missing")
    built = build_stack([drill_fleet.url(k) for k in range(drill_fleet.size)])
    built.start_ingest()  # the general worker and beat: reconcile runs every 5 s
    time.sleep(8.0)  # a reconcile run or two with everything up
    yield built
    built.close()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _settled_router(stack: Stack) -> dict:
    """The router as the API reports it, once it heartbeats."""
    wait_until(lambda: stack.router_info()["heartbeat"].get("pid"), 60, "router heartbeat")
    return stack.router_info()


def _heartbeats_after(stack: Stack, beat: str) -> bool:
    return stack.router_info()["last_heartbeat"] != beat


def _hold_outage(stop: Callable[[], None], start: Callable[[], None]) -> float:
    stop()
    time.sleep(OUTAGE_S)
    start()
    return time.monotonic()


def _no_restart_row(
    scenario: str, stack: Stack, before: dict, outcome: Outcome, back_s: float, what: str
) -> None:
    info = stack.router_info()
    same = info["heartbeat"].get("pid") == before["heartbeat"]["pid"] and _alive(
        before["heartbeat"]["pid"]
    )
    record(
        scenario,
        outcome,
        back_s,
        notes=f"{what}; router pid {'unchanged' if same else 'CHANGED'}, restarts "
        f"{before['restarts']}->{info['restarts']} over the outage and "
        f"{SETTLE_S:g} s after; recovery = outage over -> heartbeats recorded again",
        router_restarted=not same,
    )
    assert outcome.lost == 0 and outcome.succeeded == outcome.sent, outcome.lost_examples
    assert same, (before["heartbeat"], info["heartbeat"])
    assert info["restarts"] == before["restarts"]


def test_control_plane_down_with_beat_restarts_no_healthy_router(stack):
    before = _settled_router(stack)
    load = BackgroundLoad(stack.router_url, max_tokens=400)
    back = _hold_outage(stack.stop_web, stack.start_web)
    wait_until(
        lambda: _heartbeats_after(stack, before["last_heartbeat"]), 30, "heartbeats recorded again"
    )
    back_s = time.monotonic() - back
    time.sleep(max(0.0, SETTLE_S - back_s))
    _no_restart_row(
        f"control plane down {OUTAGE_S:g} s, beat + reconcile running",
        stack,
        before,
        load.finish(),
        back_s,
        "reconcile probed /healthz, saw the control plane deaf and restarted "
        "nobody; streams of up to 400 tokens ran throughout",
    )


def test_postgres_down_with_reconcile_restarts_no_router(stack):
    before = _settled_router(stack)
    load = BackgroundLoad(stack.router_url, max_tokens=400)
    back = _hold_outage(stack.postgres.stop, stack.postgres.start)
    wait_until(
        lambda: _heartbeats_after(stack, before["last_heartbeat"]), 60, "heartbeats recorded again"
    )
    back_s = time.monotonic() - back
    time.sleep(max(0.0, SETTLE_S - back_s))
    _no_restart_row(
        f"postgres down {OUTAGE_S:g} s, reconcile running (private cluster)",
        stack,
        before,
        load.finish(),
        back_s,
        "the stack's own Postgres was stopped (pg_ctl), never the machine's; "
        "after it returned the router had a whole heartbeat timeout to report",
    )


def test_routers_worker_sigkill_leaves_no_orphan(stack):
    before = _settled_router(stack)
    router_pid = before["heartbeat"]["pid"]
    worker = stack.processes["routers-worker"]
    load = BackgroundLoad(stack.router_url, transport="clear", max_tokens=64)
    time.sleep(1.0)
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    killed = time.monotonic()
    wait_until(lambda: not _alive(router_pid), ORPHAN_EXIT_BOUND_S, "orphan router to exit")
    orphan_s = time.monotonic() - killed
    stack.start_routers_worker()
    recovery_s = time.monotonic() - killed
    outcome = load.finish()
    after = asyncio.run(Load(stack.router_url + "/v1/completions", concurrency=4).run(count=40))
    outcome.merge(after)
    wait_until(
        lambda: stack.router_info()["heartbeat"].get("pid") not in (None, router_pid),
        60,
        "the new router heartbeating",
    )
    info = stack.router_info()
    record(
        "routers worker SIGKILL (router must not outlive it)",
        outcome,
        recovery_s,
        notes=f"router pid {router_pid} exited {orphan_s:.1f} s after its worker was "
        f"killed (parent-death signal + watchdog); new worker started router pid "
        f"{info['heartbeat'].get('pid')}; client errors {outcome.clear_kinds} "
        "(refused while no router); recovery = kill -> new router serving "
        "(includes starting the new worker)",
        orphan_exit_s=round(orphan_s, 2),
    )
    assert outcome.lost == 0, outcome.lost_examples
    assert after.succeeded == after.sent
    assert info["heartbeat"].get("pid") != router_pid


def _second_operator(stack: Stack) -> dict[str, str]:
    token = stack.manage("shell", "-c", SECOND_OPERATOR).split("TOKEN", 1)[1].strip()
    return {"Authorization": f"Bearer {token}"}


def _instances(stack: Stack) -> dict[str, dict]:
    response = stack.api(f"/clusters/{stack.seed['cluster']}/instances")
    response.raise_for_status()
    return {i["name"]: i for i in response.json()}


def _toggle(
    stack: Stack, headers: dict, instance: dict, revision: int, tag: str, barrier: threading.Barrier
) -> httpx.Response:
    action = "enable" if instance["state"] == "draining" else "drain"
    barrier.wait()
    return httpx.post(
        f"{stack.cp_url}/api/v1/instances/{instance['id']}/{action}",
        json={"reason": tag, "expected_revision": revision},
        headers=headers,
        timeout=10,
    )


def _race_round(stack: Stack, operators: list[dict], round_no: int) -> dict[str, httpx.Response]:
    cluster = stack.api(f"/clusters/{stack.seed['cluster']}").json()
    instances = _instances(stack)
    barrier, answers = threading.Barrier(2), {}

    def edit(k: int) -> None:
        tag = f"race-drill round {round_no} operator {k}"
        answers[tag] = _toggle(
            stack, operators[k], instances[f"i{k}"], cluster["revision"], tag, barrier
        )

    threads = [threading.Thread(target=edit, args=(k,)) for k in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return answers


def _audited_tags(stack: Stack) -> list[str]:
    response = stack.api(f"/audit-events?cluster={stack.seed['cluster']}&limit=1000")
    response.raise_for_status()
    return [e["reason"] for e in response.json()["items"] if e["reason"].startswith("race-drill")]


def test_two_operators_racing_a_config_edit(stack):
    operators = [stack.api_headers, _second_operator(stack)]
    load = BackgroundLoad(stack.router_url)
    edits, accepted, stale_ok = Outcome(), [], 0
    for round_no in range(RACE_ROUNDS):
        for tag, answer in _race_round(stack, operators, round_no).items():
            if answer.status_code == 200:
                edits.add("ok")
                accepted.append(tag)
            elif answer.status_code == 409 and "current_revision" in answer.json()["error"]:
                edits.add("clear", "409 stale revision")
                stale_ok += 1
            else:
                edits.add("lost", f"{answer.status_code} {answer.text[:200]}")
    routed = load.finish()
    audited = _audited_tags(stack)
    missing = sorted(set(accepted) - set(audited))
    edits.audit_events_lost = len(missing)
    record(
        "two operators racing config edits (revision check)",
        edits,
        None,
        notes=f"{RACE_ROUNDS} rounds of two concurrent drain/enable edits made against "
        f"the same revision: {len(accepted)} applied, {stale_ok} refused with 409 "
        f"and the current revision; audit rows for accepted edits "
        f"{len(accepted) - len(missing)}/{len(accepted)}; routing meanwhile "
        f"{routed.succeeded}/{routed.sent} ok",
        audit_expected=len(accepted),
        audit_lost=len(missing),
        routing_sent=routed.sent,
        routing_lost=routed.lost,
    )
    assert edits.lost == 0, edits.lost_examples
    assert len(accepted) == RACE_ROUNDS and stale_ok == RACE_ROUNDS  # one winner per round
    assert missing == [] and len(audited) == len(accepted)
    assert routed.lost == 0 and routed.succeeded == routed.sent, routed.lost_examples
