"""Probes of the control plane's own dependencies (Postgres, Redis)."""

from __future__ import annotations

from dataclasses import dataclass

import redis
from django.conf import settings
from django.db import connections
from django.db.utils import Error as DatabaseError


@dataclass(frozen=True)
class DependencyHealth:
    database: str
    redis: str

    @property
    def down(self) -> list[str]:
        return [name for name, state in self.as_dict().items() if state != "ok"]

    def as_dict(self) -> dict[str, str]:
        return {"database": self.database, "redis": self.redis}


def probe_database() -> str:
    try:
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except DatabaseError as exc:
        connections["default"].close_if_unusable_or_obsolete()
        return f"down: {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
    return "ok"


def probe_redis(url: str | None = None) -> str:
    client = redis.Redis.from_url(
        url or settings.REDIS_URL,
        socket_connect_timeout=settings.REDIS_SOCKET_TIMEOUT,
        socket_timeout=settings.REDIS_SOCKET_TIMEOUT,
    )
    try:
        client.ping()
    except redis.RedisError as exc:
        return f"down: {type(exc).__name__}: {exc}"
    finally:
        client.close()
    return "ok"


def probe_dependencies() -> DependencyHealth:
    return DependencyHealth(database=probe_database(), redis=probe_redis())
