"""The Redis key of a Celery queue in this test run (the broker prefixes every key with the
run's id: controlplane/settings_test.py)."""

from __future__ import annotations

from django.conf import settings


def queue_key(queue: str) -> str:
    prefix = settings.CELERY_BROKER_TRANSPORT_OPTIONS.get("global_keyprefix", "")
    return f"{prefix}{queue}"
