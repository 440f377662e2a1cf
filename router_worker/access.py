"""Client API keys: who may use the router, and who may see how it decides.

Keys are issued by the control plane; only their sha256 travels in the configuration, so
the router checks a request by hashing the bearer token it presents (keys are random and
long, so a plain hash is enough and a dict lookup by hash leaks nothing of the key).

What a client is shown (``Detail``): everyone gets the request id; the route headers
(instance, policy, arm, reason) go to everyone on an open cluster but only to debug keys on
a cluster that requires keys; the debug headers (per-candidate scores, cached tokens: they
tell whether someone else recently sent a prefix) only to keys with the debug right.
"""

from __future__ import annotations

import hashlib
from enum import IntEnum

from router_worker.errors import APIError
from router_worker.routing.features import DEFAULT_TENANT
from router_worker.runtime import Runtime

DEBUG_RIGHT = "debug"
NO_KEY = (
    "You didn't provide an API key. Send it as `Authorization: Bearer <key>`; "
    "keys are issued in the Switchyard control plane."
)
WRONG_KEY = (
    "Incorrect API key provided, or the key was revoked. Keys are issued in the "
    "Switchyard control plane."
)


class Detail(IntEnum):
    REQUEST_ID = 0
    ROUTE = 1
    DEBUG = 2


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def client_key(runtime: Runtime, authorization: str | None) -> str | None:
    """The sha256 of the valid key presented, or None when none valid was presented.
    Raises APIError 401 when the cluster requires a key and none valid was presented."""
    token = bearer_token(authorization) if runtime.client_keys else None
    digest = None
    if token is not None:
        digest = hashlib.sha256(token.encode()).hexdigest()
        if digest not in runtime.client_keys:
            digest = None
    if digest is None and runtime.config.client_auth.required:
        raise APIError(401, WRONG_KEY if bearer_token(authorization) else NO_KEY)
    return digest


def client_rights(runtime: Runtime, authorization: str | None) -> frozenset[str] | None:
    """The rights of the key presented, or None when no valid key was presented.
    Raises APIError 401 when the cluster requires a key and none valid was presented."""
    digest = client_key(runtime, authorization)
    return None if digest is None else runtime.client_keys[digest]


def tenant_of(runtime: Runtime, digest: str | None) -> str:
    """The tenant of the key (by its sha256); the default tenant without one."""
    return DEFAULT_TENANT if digest is None else runtime.key_tenants[digest]


def detail_for(runtime: Runtime, rights: frozenset[str] | None, wants_debug: bool) -> Detail:
    may_debug = rights is not None and DEBUG_RIGHT in rights
    if may_debug and wants_debug:
        return Detail.DEBUG
    if may_debug or not runtime.config.client_auth.required:
        return Detail.ROUTE
    return Detail.REQUEST_ID
