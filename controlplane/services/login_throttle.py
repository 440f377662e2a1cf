"""Login throttling: after ``FAILURES_ALLOWED`` failed logins for one (username, client IP)
within ``WINDOW_S`` seconds, further attempts for that pair are refused until the window
(counted from the first failure) runs out. A successful login clears the counter.

Counters live in Redis (``switchyard:login-failures:<sha256>``, so neither names nor
addresses are stored in clear). If Redis is unreachable the throttle fails open and says so
in the log: logging in must not depend on the telemetry store.
"""

from __future__ import annotations

import hashlib
import logging

import redis

from controlplane.services.notify import redis_client

log = logging.getLogger(__name__)
FAILURES_ALLOWED = 5
WINDOW_S = 300
KEY_PREFIX = "switchyard:login-failures:"


def _key(username: str, ip: str) -> str:
    digest = hashlib.sha256(f"{username.strip().lower()}\0{ip}".encode()).hexdigest()
    return KEY_PREFIX + digest


def is_locked(username: str, ip: str) -> bool:
    try:
        with redis_client() as client:
            count = client.get(_key(username, ip))
    except redis.RedisError as exc:
        log.warning("login throttle unavailable (%s); not throttling", exc)
        return False
    return count is not None and int(count) >= FAILURES_ALLOWED


def record_failure(username: str, ip: str) -> None:
    key = _key(username, ip)
    try:
        with redis_client() as client:
            pipe = client.pipeline()
            pipe.incr(key)
            pipe.expire(key, WINDOW_S, nx=True)
            pipe.execute()
    except redis.RedisError as exc:
        log.warning("login throttle could not count a failure (%s)", exc)


def clear(username: str, ip: str) -> None:
    try:
        with redis_client() as client:
            client.delete(_key(username, ip))
    except redis.RedisError as exc:
        log.warning("login throttle could not clear a counter (%s)", exc)
