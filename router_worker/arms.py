"""Canary arm assignment: a stable hash of the session key picks the arm by weight.

``blake2b(session key)`` → a point in [0, 100); arms own consecutive weight ranges in
config order, so a session stays in one arm as long as the weights do not change, and
every router process assigns it the same way. No key (or ``assignment_key: random``) →
a uniformly random point.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from hashlib import blake2b

_SCALE = 100.0 / float(1 << 64)


def session_point(session_key: str) -> float:
    """Stable point in [0, 100) for a session key."""
    digest = blake2b(session_key.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") * _SCALE


def pick_arm(
    cumulative_weights: Sequence[float], session_key: str | None, rng: random.Random
) -> int:
    """Index of the arm whose cumulative weight range contains the request's point."""
    if len(cumulative_weights) == 1:
        return 0
    point = session_point(session_key) if session_key is not None else rng.random() * 100.0
    for index, bound in enumerate(cumulative_weights):
        if point < bound:
            return index
    return len(cumulative_weights) - 1
