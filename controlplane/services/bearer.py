"""Bearer secrets (API tokens, router tokens): generated here, stored only as sha256."""

from __future__ import annotations

import hashlib
import secrets

ROUTER_TOKEN_PREFIX = "syr"


def sha256_hex(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode()).hexdigest()


def new_secret(nbytes: int = 32) -> str:
    return secrets.token_urlsafe(nbytes)


def new_router_token() -> str:
    """A router deployment's bearer token (``syr_<secret>``), issued on creation and on
    every supervised start."""
    return f"{ROUTER_TOKEN_PREFIX}_{new_secret()}"


def same_hash(plaintext: str, stored_hash: str) -> bool:
    return bool(stored_hash) and secrets.compare_digest(sha256_hex(plaintext), stored_hash)
