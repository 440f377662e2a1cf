"""Chained block hashes of token sequences, vectorised with numpy.

Block i's hash identifies tokens[0 : (i + 1) * block_size]: each block's content is
mixed into a 64-bit value c_i, and the chain is the polynomial prefix sum
H_i = sum_{j <= i} c_j * P**j (mod 2**64), finalised with splitmix64. Equal prefixes
give equal hashes; differing prefixes collide with probability ~2**-63. The values
do not match vLLM's (they need not: only this engine and its tests compare them).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_MASK63 = np.uint64((1 << 63) - 1)
_P = np.uint64(0x9E3779B97F4A7C15)
_rng = np.random.default_rng(0x5EED)
_LANE_MULTIPLIERS: dict[int, np.ndarray] = {}
_powers = np.ones(1, dtype=np.uint64)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _lane_multipliers(block_size: int) -> np.ndarray:
    mult = _LANE_MULTIPLIERS.get(block_size)
    if mult is None:
        mult = _rng.integers(1, 2**63, size=block_size, dtype=np.uint64) | np.uint64(1)
        _LANE_MULTIPLIERS[block_size] = mult
    return mult


def _chain_powers(n: int) -> np.ndarray:
    global _powers
    if len(_powers) < n:
        size = max(n, 2 * len(_powers))
        with np.errstate(over="ignore"):
            steps = np.full(size, _P, dtype=np.uint64)
            steps[0] = np.uint64(1)
            _powers = np.cumprod(steps, dtype=np.uint64)
    return _powers[:n]


def block_hashes(token_ids: Sequence[int] | np.ndarray, block_size: int = 16) -> list[int]:
    """Chained hashes of the full blocks of ``token_ids`` (a trailing partial block is skipped)."""
    tokens = np.asarray(token_ids, dtype=np.uint64)
    n = len(tokens) // block_size
    if n == 0:
        return []
    with np.errstate(over="ignore"):
        blocks = tokens[: n * block_size].reshape(n, block_size)
        content = _splitmix64((blocks * _lane_multipliers(block_size)).sum(axis=1, dtype=np.uint64))
        chained = np.cumsum(content * _chain_powers(n), dtype=np.uint64)
        return (_splitmix64(chained) & _MASK63).tolist()
