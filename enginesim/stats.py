"""The confidence intervals every report gives, in one place: of a mean (Student t, over
seeds or samples: the benches, the replay cells' seeds, the canary page) and of a
percentile (order statistics: the canary page). Percentiles and the load CV themselves are
``engine_interface.stats``'s, which the router imports too.

scipy is imported where an interval needs it, not at import: a router host's Celery worker
loads the control plane's services without the simulator's stack.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine_interface.stats import _check_q, percentile

CONFIDENCE = 0.95


@dataclass(frozen=True, slots=True)
class Estimate:
    """A mean over ``n`` samples and the half-width of its confidence interval (inf with
    fewer than two samples: one sample says nothing about the spread)."""

    mean: float
    half_width: float
    n: int

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width

    def overlaps(self, other: Estimate) -> bool:
        return self.low <= other.high and other.low <= self.high

    def format(self, spec: str) -> str:
        """``mean ± half-width`` (the mean alone when there is no interval)."""
        if math.isfinite(self.half_width):
            return f"{self.mean:{spec}} ± {self.half_width:{spec}}"
        return format(self.mean, spec)

    def to_json(self) -> dict[str, float | int | None]:
        half = self.half_width if math.isfinite(self.half_width) else None
        return {"mean": self.mean if math.isfinite(self.mean) else None, "ci": half, "n": self.n}


def mean_ci(values: Sequence[float] | np.ndarray, confidence: float = CONFIDENCE) -> Estimate:
    """The mean of ``values`` and the half-width of its two-sided Student-t interval
    (n − 1 degrees of freedom). Identical values give a zero-width interval."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("mean_ci needs at least one value")
    mean = float(x.mean())
    if x.size < 2:
        return Estimate(mean, math.inf, 1)
    from scipy import stats  # here: see the module docstring

    sem = float(stats.sem(x))
    if sem == 0.0:
        return Estimate(mean, 0.0, int(x.size))
    if not math.isfinite(sem):
        return Estimate(mean, math.inf, int(x.size))
    half = sem * float(stats.t.ppf((1 + confidence) / 2, x.size - 1))
    return Estimate(mean, half, int(x.size))


def quantile_ci(
    sorted_values: Sequence[float], q: float, confidence: float = CONFIDENCE
) -> tuple[float, float] | None:
    """Distribution-free interval of the ``q``-th percentile (q in [0, 100], as
    :func:`percentile`) from order statistics (normal approximation of the binomial
    rank); None for fewer than two values."""
    _check_q(q)
    n = len(sorted_values)
    if n < 2:
        return None
    from scipy import stats  # here: see the module docstring

    z = float(stats.norm.ppf((1 + confidence) / 2))
    p = q / 100
    spread = z * math.sqrt(n * p * (1 - p))
    low = max(0, math.floor(n * p - spread))
    high = min(n - 1, math.ceil(n * p + spread))
    return sorted_values[low], sorted_values[high]


def describe(values: Sequence[float]) -> dict[str, Any]:
    """n, mean, p50 and p99 of raw samples with their intervals (None where undefined)."""
    ordered = sorted(values)
    mean = mean_ci(ordered) if ordered else None
    return {
        "n": len(ordered),
        "mean": mean.mean if mean is not None else None,
        "mean_ci": (mean.low, mean.high) if mean is not None and len(ordered) > 1 else None,
        "p50": percentile(ordered, 50),
        "p50_ci": quantile_ci(ordered, 50),
        "p99": percentile(ordered, 99),
        "p99_ci": quantile_ci(ordered, 99),
    }
