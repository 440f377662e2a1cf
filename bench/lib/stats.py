"""The router's own histograms from its Prometheus ``/metrics``, read between two scrapes."""

from __future__ import annotations

import httpx

from bench.lib.processes import ROUTER_ADMIN_TOKEN
from engine_interface import Histogram, read_histogram, read_samples

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
