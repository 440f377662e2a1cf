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

from bench.lib.processes import ROUTER_ADMIN_TOKEN
from engine_interface import Histogram, read_histogram, read_samples
from enginesim.stats import CONFIDENCE, Estimate, mean_ci

TIE_TOLERANCE = 0.01  # of the reference's mean: a smaller difference is a tie however sure

Standing = Literal["better", "worse", "tie"]
Verdict = Literal["ahead", "behind", "tie"]


@dataclass(frozen=True, slots=True)
class Comparison:
    """``a`` against a reference ``b``, seed by seed: the outcome from ``a``'s side, the
    per-seed difference a − b, and the relative difference of the means."""

    outcome: Standing
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
