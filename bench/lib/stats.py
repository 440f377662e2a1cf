"""Statistics the benches share: a mean over seeds with its confidence interval, one rule
for telling two policies apart, and the verdict of a comparison on several metrics; and the
router's own histograms from its Prometheus ``/metrics``, read between two scrapes.

A bench that runs each setting under several seeds reports ``mean ± half-width`` of the
two-sided Student-t interval (:func:`mean_ci`). Two settings run under the same seeds are
compared *paired* (seed i against seed i: the same requests and the same tie-breaks, so
what differs is the policy): their difference is a tie when the interval of the per-seed
differences holds 0 — a paired t-test at the same confidence — or when it is within
``tolerance`` of the reference's mean, too small to matter even if it is real
(:func:`compare`). With one seed there is no interval, so nothing can be told apart.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import httpx
import numpy as np
from scipy import stats as scipy_stats

from bench.lib.processes import ROUTER_ADMIN_TOKEN
from engine_interface import Histogram, read_histogram, read_samples

CONFIDENCE = 0.95
TIE_TOLERANCE = 0.01  # of the reference's mean: a smaller difference is a tie however sure

Outcome = Literal["better", "worse", "tie"]
Verdict = Literal["ahead", "behind", "tie"]


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
    sem = float(scipy_stats.sem(x))
    if sem == 0.0:
        return Estimate(mean, 0.0, int(x.size))
    half = sem * float(scipy_stats.t.ppf((1 + confidence) / 2, x.size - 1))
    return Estimate(mean, half, int(x.size))


@dataclass(frozen=True, slots=True)
class Comparison:
    """``a`` against a reference ``b``, seed by seed: the outcome from ``a``'s side, the
    per-seed difference a − b, and the relative difference of the means."""

    outcome: Outcome
    difference: Estimate
    relative: float  # mean(a) / mean(b) − 1; nan when b's mean is 0

    def to_json(self) -> dict[str, object]:
        return {
            "outcome": self.outcome,
            "difference": self.difference.to_json(),
            "relative": self.relative if math.isfinite(self.relative) else None,
        }


def compare(
    a: Sequence[float] | np.ndarray,
    b: Sequence[float] | np.ndarray,
    *,
    higher_is_better: bool,
    confidence: float = CONFIDENCE,
    tolerance: float = TIE_TOLERANCE,
) -> Comparison:
    """Paired comparison of ``a`` with the reference ``b`` (value i of each from seed i).

    A tie when the ``confidence`` interval of the differences holds 0 or when the mean
    difference is within ``tolerance`` of b's mean; otherwise better or worse by the sign.
    """
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.shape != y.shape:
        raise ValueError(f"paired samples differ in size: {x.size} and {y.size}")
    difference = mean_ci(x - y, confidence)
    reference = float(y.mean())
    relative = float(x.mean()) / reference - 1 if reference != 0 else math.nan
    small = abs(difference.mean) <= tolerance * abs(reference)
    if small or difference.low <= 0.0 <= difference.high:
        return Comparison("tie", difference, relative)
    better = (difference.mean > 0) == higher_is_better
    return Comparison("better" if better else "worse", difference, relative)


def verdict(comparisons: Mapping[str, Comparison]) -> tuple[Verdict, str | None]:
    """One verdict from comparisons on several metrics in order of importance, and the
    metric that decided it: the first one that is not a tie (lexicographic order)."""
    for name, comparison in comparisons.items():
        if comparison.outcome != "tie":
            return ("ahead" if comparison.outcome == "better" else "behind"), name
    return "tie", None


def rule_text(confidence: float = CONFIDENCE, tolerance: float = TIE_TOLERANCE) -> str:
    """The tie rule in words, for a report's header (from the parameters it runs with)."""
    return (
        f"two policies differ on a metric only when the {confidence:.0%} Student-t interval "
        "of their per-seed differences (seed i against seed i) excludes 0 — a paired "
        f"t-test — and the mean difference exceeds {tolerance:.0%} of the reference's "
        "mean; otherwise they tie. With one seed nothing differs."
    )


# ----------------------------------------------------------------- router histograms

HOT_PATH = ("tokenize", "hashing", "decision", "overhead", "loop_lag")


def router_histograms(port: int) -> dict[str, Histogram]:
    """The router's hot-path histograms (every label set merged), by short name."""
    names = {short: f"switchyard_router_{short}_seconds" for short in HOT_PATH}
    text = httpx.get(
        f"http://127.0.0.1:{port}/metrics",
        headers={"Authorization": f"Bearer {ROUTER_ADMIN_TOKEN}"},
    ).text
    samples, _ = read_samples(text, list(names.values()))
    return {short: read_histogram(samples, name) or Histogram() for short, name in names.items()}


def bucket_quantile(
    before: dict[str, Histogram], after: dict[str, Histogram], name: str, q: float = 50
) -> float:
    """Upper bound (s) of the bucket holding percentile ``q`` (0..100) of the observations
    between two scrapes (inf when it lies beyond the last bucket, nan without
    observations)."""
    bound = after[name].since(before[name]).quantile_bound(q)
    return float("nan") if bound is None else bound
