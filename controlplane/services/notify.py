"""Fire-and-forget Redis notifications sent after a transaction commits."""

from __future__ import annotations

import json
import logging

import redis
from django.conf import settings
from django.db import transaction

from router_worker.contract.telemetry import CONFIG_CHANNEL

log = logging.getLogger(__name__)

CLUSTER_EVENTS_GROUP = "cluster.{cluster}"


def redis_client() -> redis.Redis:
    return redis.Redis.from_url(
        settings.REDIS_URL,
        socket_connect_timeout=settings.REDIS_SOCKET_TIMEOUT,
        socket_timeout=settings.REDIS_SOCKET_TIMEOUT,
    )


def _publish_now(channel: str, message: dict) -> None:
    try:
        with redis_client() as client:
            client.publish(channel, json.dumps(message))
    except redis.RedisError as exc:
        # Routers also poll for new versions, so a lost notification only delays them.
        log.warning("could not publish to %s (%s); routers will find it by polling", channel, exc)


def config_version_created(cluster_name: str, number: int) -> None:
    message = {"cluster": cluster_name, "version": number}
    transaction.on_commit(lambda: _publish_now(CONFIG_CHANNEL, message))
