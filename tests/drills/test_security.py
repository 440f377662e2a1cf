"""Security drills: authorization across UI views, websockets and router admin endpoints
(the API matrix is tests/controlplane/test_api_permissions.py), login throttling, and
secrets kept out of logs and API responses."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator

import httpx
import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect
from websockets.typing import Origin

from controlplane.realtime.publisher import channel_layer_sender
from controlplane.realtime.state import group_name
from controlplane.services import login_throttle, router_deployments, tokens
from devharness import free_port, router_env, start_router, stop_process, wait_until
from tests.controlplane.helpers import SYSTEM, build_world, make_user, session_client
from tests.drills.helpers import drill_config
from tests.drills.report import Outcome, record
from tests.router.helpers import ADMIN_TOKEN
from tests.web.helpers import Server, start_asgi

VIEWER_PAGES = [
    "/",
    "/clusters/{alpha}/",
    "/clusters/{alpha}/snapshot.json",
    "/clusters/{alpha}/policy/",
    "/clusters/{alpha}/policy/params/?kind=linear",
    "/clusters/{alpha}/routers/",
    "/clusters/{alpha}/canary/",
    "/clusters/{alpha}/canary/{draft}/",
    "/clusters/{alpha}/canary/{draft}/comparison/",
    "/clusters/{alpha}/replays/",
    "/clusters/{alpha}/replays/{replay}/",
    "/hotspots/",
    "/audit/",
]
OPERATOR_POSTS = [
    "/clusters/{alpha}/policy/apply/",
    "/clusters/{alpha}/canary/create/",
    "/clusters/{alpha}/canary/{draft}/start/",
    "/clusters/{alpha}/replays/create/",
]


def _expected(role: str | None, method: str) -> str:
    if role is None:
        return "login"
    if role == "none" or (method == "POST" and role == "viewer"):
        return "forbidden"
    return "allowed"


def _verdict(response) -> str:
    if response.status_code == 302 and "/login/" in response.headers.get("Location", ""):
        return "login"
    if response.status_code == 403:
        return "forbidden"
    return "allowed" if response.status_code < 500 else f"error {response.status_code}"


@pytest.mark.django_db
def test_ui_views_authorization_matrix():
    world = build_world()
    people = {
        None: None,
        "none": make_user(None, "no-role"),
        "viewer": make_user("viewer"),
        "operator": make_user("operator"),
    }
    outcome, wrong = Outcome(), []
    for role, user in people.items():
        client = session_client(user)
        for method, paths in (("GET", VIEWER_PAGES), ("POST", OPERATOR_POSTS)):
            for template in paths:
                path = template.format(**world.ids)
                call = client.get if method == "GET" else client.post
                got, want = _verdict(call(path)), _expected(role, method)
                # allowed as it should be: succeeded; refused as it should be: failed clear
                verdict = "lost" if got != want else "ok" if want == "allowed" else "clear"
                outcome.add(verdict, f"{role} {method} {path}")
                if got != want:
                    wrong.append((role, method, path, got, want))
    # The tally itself: every request the role may make counts as succeeded, every refusal
    # it should get as failed clear (an allowed request is never a "failure").
    cells = [
        _expected(role, method)
        for role in people
        for method, paths in (("GET", VIEWER_PAGES), ("POST", OPERATOR_POSTS))
        for _ in paths
    ]
    allowed = cells.count("allowed")
    if not wrong:
        assert (outcome.succeeded, outcome.failed_clear) == (allowed, len(cells) - allowed)
    record(
        "authz matrix: UI views",
        outcome,
        None,
        notes="anonymous->login, no role->403, viewer POST->403, operator allowed; "
        "succeeded = allowed where the role allows it, failed clear = refused where it does not",
    )
    assert not wrong


def _session_cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}"


def _ws_opens(url: str, cookie: str | None, origin: str | None) -> bool:
    """A websocket handshake with the real server over TCP: True when it opens (and the
    socket then carries what the server publishes), False when the server refuses it."""
    headers = [("Cookie", cookie)] if cookie else []
    try:
        connection = ws_connect(
            url,
            origin=None if origin is None else Origin(origin),
            additional_headers=headers,
            open_timeout=10,
        )
    except InvalidStatus as refused:
        assert refused.response.status_code == 403, refused.response.status_code
        return False
    with connection:
        return True


@pytest.fixture
def asgi_server(tmp_path) -> Iterator[Server]:
    """The control plane's ASGI application under uvicorn, on this test's database."""
    server = start_asgi(free_port(), tmp_path / "uvicorn.log")
    yield server
    stop_process(server.process)


@pytest.mark.django_db(transaction=True)
def test_websocket_needs_session_role_and_allowed_origin(asgi_server):
    world = build_world()
    viewer_cookie = _session_cookie(make_user("viewer", "ws-viewer"))
    nobody_cookie = _session_cookie(make_user(None, "ws-nobody"))
    url = asgi_server.url.replace("http://", "ws://") + f"/ws/clusters/{world['alpha']}/"
    good, evil = "http://127.0.0.1", "http://evil.example"
    cases = [
        ("no session", None, good, False),
        ("no role", nobody_cookie, good, False),
        ("foreign origin", viewer_cookie, evil, False),
        ("no origin header", viewer_cookie, None, False),
        ("viewer, allowed origin", viewer_cookie, good, True),
    ]
    outcome = Outcome()
    for label, cookie, origin, expected in cases:
        opened = _ws_opens(url, cookie, origin)
        verdict = "lost" if opened != expected else "ok" if expected else "clear"
        outcome.add(verdict, f"{label}: {'opened' if opened else 'refused'}")
    # the socket a viewer opens carries the cluster's live feed
    viewer = [("Cookie", viewer_cookie)]
    with ws_connect(url, origin=Origin(good), additional_headers=viewer) as live:
        async_to_sync(channel_layer_sender())(
            group_name(world["alpha"]), {"type": "snapshot", "drill": 1}
        )
        assert json.loads(live.recv(timeout=10)) == {"type": "snapshot", "drill": 1}
    record(
        "authz matrix: websockets",
        outcome,
        None,
        notes="over TCP to uvicorn: refused (403) without session or role, with a foreign "
        "Origin or none; a viewer's socket opens and carries the cluster's feed",
    )
    assert outcome.lost == 0, outcome.lost_examples


def _login(client: Client, username: str, password: str, path: str = "/login/"):
    return client.post(path, {"username": username, "password": password})


@pytest.mark.django_db
def test_login_attempts_are_throttled():
    username = f"throttle-{uuid.uuid4().hex[:8]}"
    user = get_user_model().objects.create_user(username, password="right-password-1")
    user.is_staff = True
    user.save()
    user.groups.add(Group.objects.get_or_create(name="viewer")[0])
    attacker = Client(REMOTE_ADDR="10.9.8.7")
    try:
        for _ in range(login_throttle.FAILURES_ALLOWED):
            refused = _login(attacker, username, "wrong")
            assert refused.status_code == 200 and b"Wrong username or password" in refused.content
        blocked = _login(attacker, username, "right-password-1")
        assert blocked.status_code == 200 and b"Too many failed login attempts" in blocked.content
        assert "_auth_user_id" not in attacker.session
        admin_blocked = _login(attacker, username, "right-password-1", "/admin/login/")
        assert b"Too many failed login attempts" in admin_blocked.content
        elsewhere = _login(Client(REMOTE_ADDR="10.1.1.1"), username, "right-password-1")
        assert elsewhere.status_code == 302  # the lock is per (username, address)
    finally:
        login_throttle.clear(username, "10.9.8.7")
        login_throttle.clear(username, "10.1.1.1")
    assert _login(attacker, username, "right-password-1").status_code == 302


@pytest.mark.django_db
def test_tokens_never_in_api_responses_or_logs(caplog):
    caplog.set_level(logging.DEBUG)
    world = build_world()
    operator = make_user("operator")
    api_token, _ = tokens.create_api_token(SYSTEM, operator, "drill")
    router_token, deployment = router_deployments.create_router_deployment(
        SYSTEM, world["alpha"], name="secret-r", host="127.0.0.1", port=8199
    )
    client = Client(headers={"Authorization": f"Bearer {api_token}"})
    bodies = [
        client.get(path).content
        for path in (
            "/api/v1/routers",
            f"/api/v1/routers/{deployment.pk}",
            "/api/v1/audit-events",
            "/api/v1/me",
            f"/api/v1/clusters/{world['alpha']}",
        )
    ]
    router_client = Client(headers={"Authorization": f"Bearer {router_token}"})
    bodies.append(router_client.get(f"/api/v1/routers/{deployment.pk}/config").content)
    bodies.append(
        Client(headers={"Authorization": "Bearer not-a-token"}).get("/api/v1/routers").content
    )
    for secret in (api_token, router_token):
        assert all(secret.encode() not in body for body in bodies)
        assert secret not in caplog.text


ADMIN_CALLS = [
    ("GET", "/admin/state"),
    ("GET", "/admin/config"),
    ("POST", "/admin/config"),
    ("POST", "/admin/instances/i0/drain"),
    ("POST", "/admin/instances/i0/undrain"),
]


def _admin_status(url: str, method: str, path: str, headers: dict[str, str]) -> int:
    return httpx.request(method, url + path, headers=headers, json={}, timeout=5).status_code


def test_router_admin_endpoints_need_the_token_and_tokens_stay_out_of_logs(drill_fleet, tmp_path):
    router_secret = f"router-secret-{uuid.uuid4().hex}"
    # the admin token from the environment, not the command line
    standalone = start_router(
        tmp_path,
        drill_config(drill_fleet),
        redis_url="none",
        log_level="DEBUG",
        env=router_env(SWITCHYARD_ROUTER_ADMIN_TOKEN=ADMIN_TOKEN),
        wait=False,
    )
    managed = start_router(
        tmp_path,
        None,
        "--control-plane", "http://127.0.0.1:9",
        "--deployment", "1",
        "--state-dir", str(tmp_path / "state"),
        "--poll-interval", "0.2",
        redis_url="none",
        log_level="DEBUG",
        env=router_env(SWITCHYARD_ROUTER_TOKEN=router_secret),
        wait=False,
    )  # fmt: skip
    url = standalone.url
    outcome = Outcome()
    try:
        standalone.wait_healthy()
        variants = {
            "none": {},
            "wrong": {"Authorization": "Bearer wrong-token"},
            "empty bearer": {"Authorization": "Bearer"},
            "router token": {"Authorization": f"Bearer {router_secret}"},
        }
        for method, path in ADMIN_CALLS:
            for label, headers in variants.items():
                status = _admin_status(url, method, path, headers)
                outcome.add("clear" if status == 401 else "lost", f"{label} {method} {path}")
            ok = _admin_status(url, method, path, {"X-Admin-Token": ADMIN_TOKEN})
            outcome.add("ok" if ok != 401 else "lost", f"token {method} {path} -> {ok}")
        # Managed without an admin token: /admin is closed whatever is sent.
        managed_url = managed.url
        wait_until(
            lambda: httpx.get(managed_url + "/health", timeout=1).status_code == 503,
            30,
            "managed router",
            managed.process,
        )
        for method, path in ADMIN_CALLS:
            status = _admin_status(managed_url, method, path, {"Authorization": "Bearer x"})
            outcome.add("clear" if status == 401 else "lost", f"no admin token {path}")
        wait_until(
            lambda: "control plane" in managed.log().lower() or len(managed.log()) > 200,
            10,
            "managed router to log its fetches",
        )
    finally:
        standalone.stop()
        managed.stop()
    logs = standalone.log() + managed.log()
    record(
        "authz matrix: router admin",
        outcome,
        None,
        notes="no/wrong token -> 401 on every /admin endpoint; tokens absent from logs",
    )
    assert outcome.lost == 0, outcome.lost_examples
    assert ADMIN_TOKEN not in logs and router_secret not in logs
