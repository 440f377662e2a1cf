"""Request features: chained block hashes of a prompt's token ids.

A prompt is cut into fixed-size blocks (``block_size`` tokens, 16 by default,
vLLM's size); only full blocks are hashed, as only full blocks are shared by a
prefix cache. Block ``k``'s hash identifies the whole prefix ``blocks[0..k]``,
so two prompts share block hash ``k`` exactly when (up to 64-bit collisions)
they share their first ``k + 1`` blocks.

The chain is a polynomial hash over per-block digests, all mod 2**64::

    digest_k = mix(tokens of block k)          # position-salted, avalanche-mixed
    S_k      = B * S_(k-1) + digest_k,   S_(-1) = parent (ROOT_HASH for a prompt)

``S_k`` is the block hash. The recurrence unrolls to
``S_k = B**(k+1) * (S_(-1) + sum_(j<=k) B**-(j+1) * digest_j)`` (B is odd, so
invertible mod 2**64), which numpy computes with one cumulative sum instead of
a Python loop per block. A short prompt's chain (up to ``SHORT_CHAIN_BLOCKS`` blocks)
is finished on Python ints instead, with the same values: there the dozen numpy calls
of the vectorised finish cost more than a loop over a few blocks. Turning a Python list
of ints into an array costs more than the hashing itself (the hot path rows of
bench/router_overhead/README.md); pass an array when you have one.

``extend_chain(parent, tokens)`` continues a chain from any block hash; the KV
index uses it to translate vLLM ``BlockStored`` events (which carry the token
ids and the parent's engine hash) into router hashes.

Pure: no I/O, no clock. Tokenization is not done here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

DEFAULT_BLOCK_SIZE = 16
DEFAULT_TENANT = "default"  # requests without a client key, keys without a tenant
ROOT_HASH = 0x243F6A8885A308D3  # parent of every prompt's first block (digits of pi)

_MASK64 = (1 << 64) - 1
_BASE = 0x9E3779B97F4A7C15  # odd, so invertible mod 2**64
_BASE_INV = pow(_BASE, -1, 1 << 64)
_MIX1_INT = 0xBF58476D1CE4E5B9
_MIX2_INT = 0x94D049BB133111EB
_MIX1 = np.uint64(_MIX1_INT)
_MIX2 = np.uint64(_MIX2_INT)
# Up to this many blocks a chain is finished on Python ints (module docstring): measured
# cheaper than numpy's finish up to about twice this.
SHORT_CHAIN_BLOCKS = 32
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)

TokenIds = Sequence[int] | np.ndarray


def _powers(base: int, count: int) -> np.ndarray:
    """[base**1, base**2, ..., base**count] mod 2**64 as uint64."""
    out = np.empty(count, dtype=np.uint64)
    value = 1
    for i in range(count):
        value = (value * base) & _MASK64
        out[i] = value
    return out


class _PowerTables:
    """Lazily grown tables of B**k and B**-k."""

    def __init__(self) -> None:
        self.size = 0
        self.pow = np.empty(0, dtype=np.uint64)
        self.inv = np.empty(0, dtype=np.uint64)

    def ensure(self, blocks: int) -> None:
        if blocks <= self.size:
            return
        size = max(blocks, 2 * self.size, 1024)
        self.pow, self.inv, self.size = _powers(_BASE, size), _powers(_BASE_INV, size), size


_TABLES = _PowerTables()
_TABLES.ensure(4096)
_SALT_CACHE: dict[int, np.ndarray] = {}


def _position_salts(block_size: int) -> np.ndarray:
    salts = _SALT_CACHE.get(block_size)
    if salts is None:
        salts = (_powers(0xD6E8FEB86659FD93, block_size) | np.uint64(1)).reshape(1, block_size)
        _SALT_CACHE[block_size] = salts
    return salts


def _splitmix(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser, in place on a uint64 array (wrapping arithmetic)."""
    x ^= x >> _S30
    x *= _MIX1
    x ^= x >> _S27
    x *= _MIX2
    x ^= x >> _S31
    return x


def _token_array(token_ids: TokenIds) -> np.ndarray:
    """Token ids as an unsigned array the digest widens to uint64 as it goes (a uint32
    array, what the approximate tokenizer makes, is used as it is: no copy)."""
    if isinstance(token_ids, np.ndarray):
        if token_ids.dtype == np.uint32:
            return token_ids
        return token_ids.astype(np.uint64, copy=False)
    return np.fromiter(token_ids, dtype=np.uint64, count=len(token_ids))


def _block_sums(tokens: np.ndarray, block_size: int) -> np.ndarray:
    """Per full block, the sum of its position-salted, xorshifted tokens (a digest before
    its SplitMix64 finish)."""
    full = len(tokens) // block_size
    blocks = tokens[: full * block_size].reshape(full, block_size)
    # One multiply-xorshift per token is enough: the per-block sum is then fully mixed.
    mixed = (blocks + np.uint64(1)) * _position_salts(block_size)
    mixed ^= mixed >> _S31
    return mixed.sum(axis=1, dtype=np.uint64)


def _block_digests(tokens: np.ndarray, block_size: int) -> np.ndarray:
    return _splitmix(_block_sums(tokens, block_size))


def _short_chain(start: int, sums: list[int]) -> list[int]:
    """The chain over blocks whose sums are ``sums``, from ``start``: the vectorised
    finish and chain of :func:`extend_chain`, on Python ints (same values)."""
    out = []
    chained = start
    for x in sums:
        x ^= x >> 30
        x = x * _MIX1_INT & _MASK64
        x ^= x >> 27
        x = x * _MIX2_INT & _MASK64
        x ^= x >> 31
        chained = (_BASE * chained + x) & _MASK64
        out.append(chained)
    return out


def extend_chain(parent: int | None, token_ids: TokenIds, block_size: int) -> list[int]:
    """Hashes of the full blocks of ``token_ids`` chained after block hash ``parent``.

    ``parent=None`` starts a new prompt (same as ``ROOT_HASH``). A trailing
    partial block is ignored.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    sums = _block_sums(_token_array(token_ids), block_size)
    count = len(sums)
    if count == 0:
        return []
    start = ROOT_HASH if parent is None else parent & _MASK64
    if count <= SHORT_CHAIN_BLOCKS:
        return _short_chain(start, sums.tolist())
    digests = _splitmix(sums)
    _TABLES.ensure(count)
    weighted = digests * _TABLES.inv[:count]
    weighted[0] = (int(weighted[0]) + start) & _MASK64
    return (_TABLES.pow[:count] * np.cumsum(weighted, dtype=np.uint64)).tolist()


def hash_blocks(token_ids: TokenIds, block_size: int = DEFAULT_BLOCK_SIZE) -> list[int]:
    """Chained hashes of the full ``block_size``-token blocks of a prompt."""
    return extend_chain(None, token_ids, block_size)


def chain_step(parent: int, digest: int) -> int:
    """One step of the chain recurrence; exposed for the naive reference in tests."""
    return (_BASE * parent + digest) & _MASK64


def block_digests(token_ids: TokenIds, block_size: int = DEFAULT_BLOCK_SIZE) -> list[int]:
    """Per-block digests before chaining (tests check the vectorised chain against them)."""
    return _block_digests(_token_array(token_ids), block_size).tolist()


@dataclass(frozen=True, slots=True)
class RequestFeatures:
    """Everything a policy may know about a request, computed once on arrival."""

    request_id: str
    prompt_tokens: int
    block_hashes: tuple[int, ...]
    block_size: int
    session_key: str | None
    turn_index: int | None
    arrival_time: float
    # Who sent it and what it asked for (the router's flow control; SLO-aware policies).
    tenant: str = DEFAULT_TENANT
    priority: str = "standard"  # critical | standard | sheddable (routing.flow.PRIORITIES)
    slo_ttft_s: float | None = None  # the request's own TTFT SLO (x-slo-ttft-ms)
    slo_tpot_s: float | None = None  # the request's own TPOT SLO (x-slo-tpot-ms)


def build_features(
    request_id: str,
    token_ids: TokenIds,
    arrival_time: float,
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
    session_key: str | None = None,
    turn_index: int | None = None,
) -> RequestFeatures:
    """Build a request's features from its prompt token ids (pure)."""
    if turn_index is not None and turn_index < 0:
        raise ValueError(f"turn_index must be >= 0, got {turn_index}")
    return RequestFeatures(
        request_id=request_id,
        prompt_tokens=len(token_ids),
        block_hashes=tuple(hash_blocks(token_ids, block_size)),
        block_size=block_size,
        session_key=session_key,
        turn_index=turn_index,
        arrival_time=arrival_time,
    )
