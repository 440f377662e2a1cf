"""Queued replays that never reached a worker are sent again; a job runs at most once."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.utils import timezone

from controlplane.models import ReplayJob
from controlplane.services import replays

pytestmark = pytest.mark.django_db


def queued_replay_messages(client: redis.Redis) -> list[bytes]:
    return [m for m in client.lrange("default", 0, -1)
            if json.loads(m)["headers"].get("task") == replays.REPLAY_TASK]


def test_stale_queued_jobs_are_dispatched_again_and_claimed_once(cluster):
    stale = ReplayJob.objects.create(cluster=cluster, inputs={"trace": "shared:x.jsonl"})
    fresh = ReplayJob.objects.create(cluster=cluster, inputs={"trace": "shared:x.jsonl"})
    ReplayJob.objects.filter(pk=stale.pk).update(created_at=timezone.now() - timedelta(hours=1))
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    try:
        for message in queued_replay_messages(client):
            client.lrem("default", 0, message)
        assert replays.redispatch_stale(older_than_s=60) == 1
        sent = queued_replay_messages(client)
        for message in sent:
            client.lrem("default", 0, message)
    finally:
        client.close()
    assert [json.loads(m)["headers"]["argsrepr"] for m in sent] == [f"[{stale.pk}]"]
    assert replays.claim(stale.pk) is not None
    assert replays.claim(stale.pk) is None  # a second delivery does not run it again
    assert ReplayJob.objects.get(pk=fresh.pk).state == "queued"
