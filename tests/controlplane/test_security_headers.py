"""Browser hardening on every response, and TLS-only cookies and HSTS when served over TLS."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("path", ["/login/", "/api/v1/docs", "/admin/login/"])
def test_every_page_forbids_inline_script_framing_and_sniffing(path: str) -> None:
    response = Client().get(path)
    assert response.status_code == 200
    policy = dict(
        part.strip().split(" ", 1)
        for part in response.headers["Content-Security-Policy"].split(";")
    )
    assert policy["script-src"] == "'self'"  # no 'unsafe-inline', no 'unsafe-eval'
    assert policy["frame-ancestors"] == "'none'" and policy["object-src"] == "'none'"
    assert response.headers["X-Frame-Options"] == "DENY"
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["Referrer-Policy"] == "same-origin"


def _settings(**env: str) -> dict:
    code = (
        "import django, json; django.setup(); from django.conf import settings as s; "
        "print(json.dumps([s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, "
        "s.SECURE_HSTS_SECONDS, s.SECURE_PROXY_SSL_HEADER]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "controlplane.settings", **env},
    )
    return json.loads(result.stdout)


def test_tls_turns_on_secure_cookies_and_hsts() -> None:
    assert _settings(SWITCHYARD_TLS="0") == [False, False, 0, None]
    assert _settings(SWITCHYARD_TLS="1") == [
        True,
        True,
        31_536_000,
        ["HTTP_X_FORWARDED_PROTO", "https"],
    ]
