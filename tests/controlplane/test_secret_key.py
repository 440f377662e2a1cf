"""Outside the demo and the tests, the control plane refuses to start without a secret key
(a default would be public, and sessions could be forged with it)."""

from __future__ import annotations

import os
import subprocess
import sys

SETUP = (
    "import django; django.setup(); from django.conf import settings; print(settings.SECRET_KEY)"
)


def _start(**env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "SWITCHYARD_SECRET_KEY"}
    return subprocess.run(
        [sys.executable, "-c", SETUP],
        capture_output=True,
        text=True,
        env={**base, "DJANGO_SETTINGS_MODULE": "controlplane.settings", **env},
    )


def test_start_fails_with_a_clear_message_without_a_secret_key() -> None:
    for missing in ({}, {"SWITCHYARD_SECRET_KEY": ""}, {"SWITCHYARD_SECRET_KEY": "  "}):
        started = _start(**missing)
        assert started.returncode != 0
        assert "SWITCHYARD_SECRET_KEY is not set" in started.stderr
        assert "ImproperlyConfigured" in started.stderr


def test_the_given_secret_key_is_used() -> None:
    started = _start(SWITCHYARD_SECRET_KEY="a-real-key-from-the-environment")
    assert started.returncode == 0, started.stderr
    assert started.stdout.strip() == "a-real-key-from-the-environment"


def test_a_retention_period_that_is_not_a_number_of_days_stops_the_start() -> None:
    """``inf`` broke every capture ingest run; ``-1`` deleted every stopped capture."""
    key = {"SWITCHYARD_SECRET_KEY": "a-real-key-from-the-environment"}
    for name in ("SWITCHYARD_CAPTURE_RETENTION_DAYS", "SWITCHYARD_UPLOAD_RETENTION_DAYS"):
        for value in ("inf", "-1", "nan", "0", "1e9", "thirty"):
            started = _start(**key, **{name: value})
            assert started.returncode != 0, (name, value)
            assert f"{name} must be a number of days" in started.stderr
        assert _start(**key, **{name: "0.5"}).returncode == 0
