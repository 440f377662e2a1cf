"""Secrets of captures and canaries stay secret and stay put: the Django admin shows a
config version as the API does (no capture digest key, no canary arm salt), a deleted
capture's key is scrubbed from the stored versions, and rotating SECRET_KEY moves no
session between a running canary's arms; the old key is accepted while it rotates."""

from __future__ import annotations

import os
import subprocess
import sys

from django.contrib.auth import get_user_model
from django.test import Client, override_settings

from controlplane.models import CanarySplit, ConfigVersion, TrafficCapture
from controlplane.router_hosts import identity
from controlplane.services import captures, config
from controlplane.services.audit import Actor

SYSTEM = Actor.system("test")


def _secrets() -> list[str]:
    salts = [c.salt for c in TrafficCapture.objects.all()]
    return salts + [config.canary_salt(c) for c in CanarySplit.objects.all()]


def test_the_admin_shows_no_salt_of_any_config_version(world) -> None:
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("root", password=None))
    secrets = _secrets()
    assert len(secrets) >= 2
    for version in ConfigVersion.objects.all():
        page = client.get(f"/admin/controlplane/configversion/{version.pk}/change/")
        assert page.status_code == 200
        assert not any(secret in page.content.decode() for secret in secrets), version


def test_a_deleted_captures_salt_does_not_outlive_it(world) -> None:
    capture = TrafficCapture.objects.get(pk=world["capture"])
    salt = capture.salt
    assert ConfigVersion.objects.filter(document__capture__salt=salt).exists()
    captures.delete_capture(SYSTEM, capture.cluster_id, capture.pk, reason="gone")
    assert not any(salt in str(v.document) for v in ConfigVersion.objects.all())


def test_a_running_canary_keeps_its_salt_when_the_secret_key_rotates(world) -> None:
    canary = CanarySplit.objects.get(pk=world["running"])
    before = config.canary_salt(canary)
    with override_settings(SECRET_KEY="a-rotated-secret-key", SECRET_KEY_FALLBACKS=["x"]):
        assert config.canary_salt(canary) == before
        assert config.canary_document(canary)["salt"] == before


def test_the_previous_secret_key_is_read_from_the_environment() -> None:
    code = (
        "import django; django.setup(); from django.conf import settings;"
        "from controlplane.router_hosts import identity;"
        "print(settings.SECRET_KEY_FALLBACKS, len(identity.peer_keys(1)[1]))"
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",
        "SWITCHYARD_SECRET_KEY": "the-new-key",
        "SWITCHYARD_SECRET_KEY_FALLBACKS": "the-old-key, older",
    }
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["['the-old-key',", "'older']", "2"]
    with override_settings(SECRET_KEY="the-new-key", SECRET_KEY_FALLBACKS=["the-old-key"]):
        current, previous = identity.peer_keys(1)
    with override_settings(SECRET_KEY="the-old-key", SECRET_KEY_FALLBACKS=[]):
        assert previous == (identity.peer_keys(1)[0],) != (current,)
