"""Canary arm assignment: a keyed hash of the session key picks the arm by weight.

``blake2b(session key, key=salt)`` → a point in [0, 100); arms own consecutive weight
ranges in config order, so a session stays in one arm as long as the weights and the
salt do not change, and every router process with the same salt assigns it the same way.
The salt is the canary's secret (``canary.salt``, set by the control plane per canary):
without it anyone could compute a session key's arm and pick the arm they want by
picking their key. A canary without one gets a random salt per router process (stable
for the process's life). No key (or ``assignment_key: random``) → a uniformly random
point.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from hashlib import blake2b

_SCALE = 100.0 / float(1 << 64)
_PROCESS_SALT = os.urandom(32)


def arm_salt(salt: str) -> bytes:
    """The hash key for a canary's salt (blake2b keys are at most 64 bytes)."""
    if not salt:
        return _PROCESS_SALT
    return blake2b(salt.encode("utf-8", "surrogatepass"), digest_size=32).digest()


def session_point(session_key: str, salt: bytes) -> float:
    """Stable point in [0, 100) for a session key under a salt (see :func:`arm_salt`)."""
    data = session_key.encode("utf-8", "surrogatepass")
    digest = blake2b(data, key=salt, digest_size=8).digest()
    return int.from_bytes(digest, "big") * _SCALE


def pick_arm(
    cumulative_weights: Sequence[float],
    session_key: str | None,
    rng: random.Random,
    salt: bytes = _PROCESS_SALT,
) -> int:
    """Index of the arm whose cumulative weight range contains the request's point."""
    if len(cumulative_weights) == 1:
        return 0
    point = session_point(session_key, salt) if session_key is not None else rng.random() * 100.0
    for index, bound in enumerate(cumulative_weights):
        if point < bound:
            return index
    return len(cumulative_weights) - 1
