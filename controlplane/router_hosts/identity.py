"""What a managed router gets besides its token: its cluster's peer-sync key and a Redis
identity of its own.

Peer key: every router of a cluster signs and verifies replica-sync batches with the same
key (router_worker/peers.py). It is derived from Django's secret key and the cluster's id,
so every host's supervisor hands out the same key without storing it anywhere; keys
derived from ``SECRET_KEY_FALLBACKS`` are still accepted while the secret key rotates.

Redis identity: a Redis ACL user per router (``ACL SETUSER``, made by the supervisor with
the control plane's own connection), with a fresh password at every start, allowed only
what `router_acl_rules` lists: its state key, its cluster's streams and peer channel, and
listening to config notices. Redis itself refuses anything else (NOPERM), so a router
cannot write another cluster's telemetry nor the control plane's keys and channels. Users
live in Redis's memory: after a Redis restart the supervisor makes them again
(`ensure_users`). Both secrets reach the router only through its environment.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from dataclasses import dataclass
from urllib.parse import quote, urlsplit, urlunsplit

import redis
from django.conf import settings

from router_worker.contract.telemetry import router_acl_rules

log = logging.getLogger(__name__)


def peer_keys(cluster_id: int) -> tuple[str, tuple[str, ...]]:
    """The cluster's signing key and the ones still accepted (from the fallback secrets)."""

    def derive(secret: str) -> str:
        label = f"switchyard peer sync key\0cluster {cluster_id}".encode()
        return hmac.new(secret.encode(), label, hashlib.sha256).hexdigest()

    fallbacks = getattr(settings, "SECRET_KEY_FALLBACKS", ())
    return derive(settings.SECRET_KEY), tuple(derive(k) for k in fallbacks)


@dataclass
class RedisIdentity:
    username: str
    password: str
    cluster: str
    router: str
    ensured: bool = False  # Redis has the user (as far as the supervisor last saw)

    def url(self, base: str) -> str:
        """``base`` (the control plane's Redis URL) with this identity's credentials."""
        parts = urlsplit(base)
        host = parts.netloc.rsplit("@", 1)[-1]
        netloc = f"{quote(self.username, safe='')}:{quote(self.password, safe='')}@{host}"
        return urlunsplit(parts._replace(netloc=netloc))


def new_identity(router_id: int, cluster: str, router: str) -> RedisIdentity:
    username = f"{settings.ROUTER_REDIS_ACL_PREFIX}router-{router_id}"
    return RedisIdentity(username, secrets.token_urlsafe(32), cluster, router)


def ensure_user(client: redis.Redis, identity: RedisIdentity) -> bool:
    """Create (or reset) the identity's ACL user; False, logged, if Redis refused or is down
    (the router starts anyway and is retried: it keeps serving without telemetry)."""
    rules = router_acl_rules(identity.cluster, identity.router)
    try:
        client.execute_command(
            "ACL", "SETUSER", identity.username, "reset", "on", f">{identity.password}", *rules
        )
    except redis.RedisError as error:
        log.warning("cannot create Redis user %s: %s", identity.username, error)
        identity.ensured = False
        return False
    identity.ensured = True
    return True


def ensure_users(client: redis.Redis, identities: list[RedisIdentity]) -> None:
    """Make again the users Redis lost (restarted without an ACL file)."""
    for identity in identities:
        try:
            present = client.execute_command("ACL", "GETUSER", identity.username) is not None
        except redis.RedisError:
            identity.ensured = False
            continue
        if not (present and identity.ensured):
            ensure_user(client, identity)


def delete_user(client: redis.Redis, identity: RedisIdentity) -> None:
    try:
        client.execute_command("ACL", "DELUSER", identity.username)
    except redis.RedisError as error:
        log.warning("cannot delete Redis user %s: %s", identity.username, error)
