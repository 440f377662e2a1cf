"""Small statistics for the pages: percentiles and confidence intervals of raw samples."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from engine_interface import percentile

Z95 = 1.959964


def quantile_ci(sorted_values: Sequence[float], q: float) -> tuple[float, float] | None:
    """95% distribution-free interval of the ``q``-th percentile (q in [0, 100], as
    ``engine_interface.percentile``) from order statistics (normal approximation of the
    binomial rank)."""
    n = len(sorted_values)
    if n < 2:
        return None
    q /= 100
    spread = Z95 * math.sqrt(n * q * (1 - q))
    low = max(0, math.floor(n * q - spread))
    high = min(n - 1, math.ceil(n * q + spread))
    return sorted_values[low], sorted_values[high]


def mean_ci(values: Sequence[float]) -> tuple[float, float] | None:
    n = len(values)
    if n < 2:
        return None
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = Z95 * sd / math.sqrt(n)
    return mean - half, mean + half


def describe(values: Sequence[float]) -> dict[str, Any]:
    """n, mean, p50 and p99 with 95% intervals."""
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "mean": sum(ordered) / len(ordered) if ordered else None,
        "mean_ci": mean_ci(ordered),
        "p50": percentile(ordered, 50),
        "p50_ci": quantile_ci(ordered, 50),
        "p99": percentile(ordered, 99),
        "p99_ci": quantile_ci(ordered, 99),
    }
