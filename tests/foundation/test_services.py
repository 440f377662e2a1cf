"""The foundation talks to real Postgres, Redis, Celery and channel layer."""

from __future__ import annotations

import pytest
from channels.layers import get_channel_layer
from django.contrib.auth import get_user_model
from django.db import connection

pytestmark = pytest.mark.django_db


def test_postgres_round_trip() -> None:
    assert connection.vendor == "postgresql"
    user = get_user_model().objects.create_user("round-trip", password="not-used-123")
    fetched = get_user_model().objects.get(pk=user.pk)
    assert fetched.username == "round-trip"
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_database()")
        assert cursor.fetchone()[0].startswith("test_")


async def test_channel_layer_round_trip_through_redis() -> None:
    layer = get_channel_layer()
    assert type(layer).__name__ == "RedisChannelLayer"
    channel = await layer.new_channel()
    await layer.group_add("foundation-test", channel)
    await layer.group_send("foundation-test", {"type": "probe.message", "value": 42})
    message = await layer.receive(channel)
    await layer.group_discard("foundation-test", channel)
    assert message == {"type": "probe.message", "value": 42}
