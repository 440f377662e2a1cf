"""Client keys for router tests: fixed plaintexts and the client_auth sections naming their
hashes (as the control plane would publish them)."""

from __future__ import annotations

import hashlib
from typing import Any

PLAIN_KEY = "syk_plain000_" + "p" * 40
DEBUG_KEY = "syk_debug000_" + "d" * 40


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def client_auth(required: bool, *, plain: bool = True) -> dict[str, Any]:
    keys = [{"sha256": key_hash(DEBUG_KEY), "rights": ["debug"]}]
    if plain:
        keys.append({"sha256": key_hash(PLAIN_KEY), "rights": []})
    return {"required": required, "keys": keys}


def debug_key_only() -> dict[str, Any]:
    """An open cluster (anyone may send requests) with one debug key."""
    return client_auth(False, plain=False)
