"""vLLM's prefix-cache block hashes are chained: a block's hash covers its tokens and its
parent's hash, so two prompts' chains are equal up to some block and differ from then on.
Helpers on such chains that the engine's block pool (enginesim) and the router's shadow
index both use; pure.
"""

from __future__ import annotations

from collections.abc import Sequence


def common_run(hashes: Sequence[int], start: int, run: Sequence[int], limit: int) -> int:
    """Leading blocks of ``run`` equal to ``hashes[start:]`` (at most ``limit``), given
    that the first ones are equal. Chained hashes: equal at k means equal up to k, so a
    binary search finds the last equal block."""
    k = min(len(run), limit)
    if hashes[start + k - 1] == run[k - 1]:
        return k
    lo, hi = 1, k - 1  # run[lo - 1] matches, run[hi] does not
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if hashes[start + mid - 1] == run[mid - 1]:
            lo = mid
        else:
            hi = mid - 1
    return lo
