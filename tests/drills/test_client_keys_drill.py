"""Drill: client API keys on a private control-plane stack (tests/drills/stack.py) with a
router supervised by the Celery routers worker. An admin creates keys and requires them
through the API; the running router enforces them from the next config version; a revoked
key is refused once that version is applied, while every other client keeps being served.
The router process also holds none of the worker's secrets."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devharness import Fleet, wait_until
from tests.drills.clients import body, classify_whole, is_error_body
from tests.drills.report import Outcome, record
from tests.drills.stack import SECRET_KEY, Stack, build_stack

REVOCATION_BOUND_S = 15.0  # pub/sub makes it ~immediate; the poll fallback is 10 s
ADMIN_SEED = """
import json
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from controlplane.services import tokens
from controlplane.services.audit import Actor
user = get_user_model().objects.create_user("drill-admin")
user.groups.add(Group.objects.get_or_create(name="admin")[0])
secret, _ = tokens.create_api_token(Actor.system("drills"), user, "client-keys drill")
print("TOKEN" + secret)
"""


@pytest.fixture(scope="module")
def stack(drill_fleet: Fleet) -> Iterator[Stack]:
    if not os.path.exists("/usr/lib/postgresql/15/bin/initdb"):
        pytest.fail("PostgreSQL 15 server binaries are missing")
    built = build_stack([drill_fleet.url(k) for k in range(drill_fleet.size)])
    yield built
    built.close()


class Admin:
    def __init__(self, stack: Stack) -> None:
        token = stack.manage("shell", "-c", ADMIN_SEED).split("TOKEN", 1)[1].strip()
        self.client = httpx.Client(
            base_url=stack.cp_url + "/api/v1",
            timeout=10,
            headers={"Authorization": f"Bearer {token}"},
        )
        self.cluster = stack.seed["cluster"]

    def call(self, method: str, path: str, payload: dict) -> dict:
        response = self.client.request(method, path.format(cluster=self.cluster), json=payload)
        assert response.status_code in (200, 201), response.text
        return response.json()

    def current_version(self) -> int:
        path = f"/clusters/{self.cluster}/config-versions"
        versions = self.client.get(path).json()
        items = versions["items"] if isinstance(versions, dict) else versions
        return max(v["number"] for v in items)


def _applied(stack: Stack) -> int | None:
    try:
        return httpx.get(stack.router_url + "/health", timeout=1).json().get("config_version")
    except (httpx.HTTPError, ValueError):
        return None


def _send(stack: Stack, key: str | None, debug: bool = False) -> httpx.Response:
    headers = {"x-switchyard-debug": "1"} if debug else {}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    return httpx.post(
        stack.router_url + "/v1/completions",
        json=body("keys", False, 4),
        headers=headers,
        timeout=30,
    )


def _expect(outcome: Outcome, response: httpx.Response, want: int, label: str) -> None:
    """ok / clear as expected, anything else (a wrong status, a leak) is lost."""
    verdict = classify_whole(response.status_code, response.text)
    expected = "ok" if want == 200 else "clear"
    right = response.status_code == want and verdict == expected
    outcome.add(
        verdict if right else "lost", f"{label}: {response.status_code} {response.text[:120]}"
    )


def _router_environment(pid: int) -> str:
    return Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")


def test_client_keys_are_enforced_and_revocation_reaches_the_running_router(stack):
    admin = Admin(stack)
    plain = admin.call("POST", "/clusters/{cluster}/client-keys", {"name": "svc"})["secret"]
    debug = admin.call("POST", "/clusters/{cluster}/client-keys", {"name": "dbg", "debug": True})[
        "secret"
    ]
    admin.call(
        "PUT",
        "/clusters/{cluster}/client-auth",
        {"required": True, "reason": "drill: keys required"},
    )
    version = admin.current_version()
    wait_until(lambda: (_applied(stack) or 0) >= version, 20, "router to apply the keys")
    outcome = Outcome()
    for _ in range(5):
        _expect(outcome, _send(stack, None), 401, "anonymous")
        _expect(outcome, _send(stack, "syk_wrong_" + "x" * 40), 401, "wrong key")
        answer = _send(stack, plain, debug=True)
        _expect(outcome, answer, 200, "plain key")
        if "x-switchyard-scores" in answer.headers or "x-switchyard-instance" in answer.headers:
            outcome.add("lost", "plain key was shown routing internals")
        answer = _send(stack, debug, debug=True)
        _expect(outcome, answer, 200, "debug key")
        if "x-switchyard-scores" not in answer.headers:
            outcome.add("lost", "debug key got no scores")
    key_id = next(
        k["id"]
        for k in admin.client.get(f"/clusters/{admin.cluster}/client-keys").json()
        if k["name"] == "svc"
    )
    revoked_at = time.monotonic()
    admin.call(
        "POST", f"/clusters/{{cluster}}/client-keys/{key_id}/revoke", {"reason": "drill: leaked"}
    )
    recovery = None
    while time.monotonic() - revoked_at < REVOCATION_BOUND_S:
        _expect(outcome, _send(stack, debug), 200, "debug key during revocation")
        answer = _send(stack, plain)
        if answer.status_code == 401 and is_error_body(answer.text):
            recovery = time.monotonic() - revoked_at
            outcome.add("clear", "revoked key refused")
            break
        _expect(outcome, answer, 200, "revoked key before the new version")
        time.sleep(0.1)
    heartbeat = admin.client.get(f"/routers/{stack.seed['deployment']}").json()["heartbeat"]
    environment = _router_environment(int(heartbeat["pid"]))
    leaked = [
        secret
        for secret in (
            SECRET_KEY,
            stack.postgres.url,
            "SWITCHYARD_DATABASE_URL",
            "SWITCHYARD_SECRET_KEY",
        )
        if secret in environment
    ]
    record(
        "client keys: required, debug right, revocation",
        outcome,
        recovery,
        notes="anonymous/wrong key -> 401, plain key served without internals, debug key "
        "gets scores; recovery_s = revoke API call -> first 401 for the revoked key "
        f"(bound {REVOCATION_BOUND_S:.0f} s); router env holds no worker secret",
    )
    assert outcome.lost == 0, outcome.lost_examples
    assert recovery is not None, "the revoked key was still accepted"
    assert leaked == []
    audit = admin.client.get("/audit-events", params={"action": "client_key.revoke"}).json()
    assert audit["count"] == 1 and "drill: leaked" in json.dumps(audit["items"][0])
