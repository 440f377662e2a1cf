"""The client-keys page (per cluster) and the API-tokens page: a secret is shown once, in
the answer to its creation (never cached, never shown again), revocation asks first and
takes effect, only admins manage client keys, and a hostile key name runs nothing.
Chromium with the CSP enforced, against uvicorn."""

from __future__ import annotations

import hashlib

import httpx
import pytest
from django.test import Client
from playwright.sync_api import Dialog

from controlplane.models import ApiToken, ClientKey, Cluster

from .helpers import login, make_cluster

pytestmark = pytest.mark.django_db(transaction=True)
HOSTILE = "'+(window.__pwned=1)+'<img src=x onerror=window.__pwned=1>"


def _sha(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _published(cluster: Cluster) -> str:
    return str(cluster.versions.latest("number").document)


def test_client_key_forms_need_the_admin_role(as_role) -> None:
    cluster = make_cluster()
    keys = f"/clusters/{cluster.pk}/keys/"
    assert as_role("viewer").get(keys).status_code == 200
    for role in ("viewer", "operator"):
        client: Client = as_role(role)
        assert client.post(keys + "create/", {"name": "k"}).status_code == 403
        assert client.post(keys + "required/", {"required": "on", "reason": "r"}).status_code == 403
        assert b"client-key-controls" not in client.get(keys).content
    assert not ClientKey.objects.exists()
    answer = as_role("admin").post(keys + "create/", {"name": "k", "debug": "on"})
    assert answer.status_code == 201 and answer["Cache-Control"] == "no-store"
    assert ClientKey.objects.get().can_debug


@pytest.mark.browser
@pytest.mark.timeout(120)
def test_admin_creates_shows_once_and_revokes_a_client_key(browser, asgi_server) -> None:
    cluster = make_cluster()
    page = login(browser, asgi_server.url, "admin", bypass_csp=False)
    dialogs: list[str] = []

    def accept(dialog: Dialog) -> None:
        dialogs.append(dialog.message)
        dialog.accept()

    page.on("dialog", accept)
    refused: list[str] = []
    page.on(
        "console",
        lambda message: (
            refused.append(message.text) if "Content Security Policy" in message.text else None
        ),
    )
    keys_url = f"{asgi_server.url}/clusters/{cluster.pk}/keys/"
    try:
        page.goto(keys_url)
        page.fill("[data-testid=client-key-controls] input[name=name]", HOSTILE[:64])
        page.check("[data-testid=client-key-controls] input[name=debug]")
        page.click("[data-testid=client-key-controls] button.primary")
        secret = page.input_value("[data-testid=new-secret]")
        key = ClientKey.objects.get(cluster=cluster)
        assert secret.startswith("syk_") and key.key_hash == _sha(secret) and key.can_debug
        assert _sha(secret) in _published(cluster) and secret not in _published(cluster)
        page.goto(keys_url)  # shown once: a later visit has the name, not the secret
        assert (
            secret not in page.content() and page.locator("[data-testid=new-secret]").count() == 0
        )
        page.fill("[data-testid=client-keys] input[name=reason]", "rotated")
        page.click("button[data-action=revoke]")
        assert dialogs and dialogs[0].startswith(f"Revoke client key {HOSTILE[:64]}?")
        page.wait_for_selector("[data-testid=key-state]:has-text('revoked')")
        assert _sha(secret) not in _published(cluster)
        page.check("[data-testid=client-auth-controls] input[name=required]")
        page.fill("[data-testid=client-auth-controls] input[name=reason]", "public launch")
        page.click("[data-testid=client-auth-controls] button")
        page.wait_for_selector("[data-testid=client-auth-state]:has-text('required')")
        assert Cluster.objects.get(pk=cluster.pk).client_keys_required
        # Its only key is revoked: the page says that every request is now refused.
        assert page.locator("[data-testid=no-active-key]").is_visible()
        assert page.evaluate("window.__pwned") is None
        assert page.locator("[onerror], [onload], [onclick]").count() == 0
        assert refused == [] and page.js_errors == []
    finally:
        page.context.close()


@pytest.mark.browser
@pytest.mark.timeout(120)
def test_a_user_creates_and_revokes_an_api_token_in_the_ui(browser, asgi_server) -> None:
    page = login(browser, asgi_server.url, "operator", bypass_csp=False)
    page.on("dialog", lambda dialog: dialog.accept())
    refused: list[str] = []
    page.on(
        "console",
        lambda message: (
            refused.append(message.text) if "Content Security Policy" in message.text else None
        ),
    )
    me = f"{asgi_server.url}/api/v1/me"
    try:
        page.click("nav.mainnav >> text=API tokens")
        page.fill("[data-testid=token-controls] input[name=name]", "laptop")
        page.fill("[data-testid=token-controls] input[name=valid_days]", "7")
        page.click("[data-testid=token-controls] button.primary")
        secret = page.input_value("[data-testid=new-secret]")
        token = ApiToken.objects.get(name="laptop")
        assert 6 <= (token.expires_at - token.created_at).days <= 7
        bearer = {"Authorization": f"Bearer {secret}"}
        assert httpx.get(me, headers=bearer, timeout=5).json()["role"] == "operator"
        page.click("tr[data-token=laptop] button[data-action=revoke]")
        page.wait_for_selector(
            "tr[data-token=laptop] [data-testid=token-state]:has-text('revoked')"
        )
        assert httpx.get(me, headers=bearer, timeout=5).status_code == 401
        # A hostile token name is shown as text, in the table and in the revoke question.
        page.fill("[data-testid=token-controls] input[name=name]", HOSTILE[:64])
        page.click("[data-testid=token-controls] button.primary")
        page.goto(f"{asgi_server.url}/tokens/")
        page.wait_for_load_state("networkidle")
        assert page.evaluate("window.__pwned") is None
        assert page.locator("[onerror], [onload], [onclick]").count() == 0
        assert refused == [] and page.js_errors == []
    finally:
        page.context.close()
