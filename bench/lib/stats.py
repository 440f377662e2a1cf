"""What the runs measured: transit times, percentiles with bootstrap intervals, and the
router's own histograms from its Prometheus ``/metrics``."""

from __future__ import annotations

import httpx
import numpy as np
import scipy.stats

from bench.lib.loadclient import Run
from bench.lib.processes import ROUTER_ADMIN_TOKEN
from engine_interface import Histogram, percentile, read_histogram, read_samples


def transit(run: Run, engine_ttft: dict[str, float]) -> list[float]:
    """Per stream: client-observed TTFT minus the engine's own TTFT (s). What the path
    between client and engine costs — loopback, the client's and the engine's socket
    handling, and in routed runs everything the router adds (its CPU, its event loop's
    queue) — without the engine's queueing and prefill, which vary with load and
    placement and would swamp a millisecond."""
    return [
        o.first - o.sent - engine_ttft[o.request_id]
        for o in run.outcomes
        if o.first is not None and o.request_id in engine_ttft
    ]


def pct(values: list[float], q: float) -> float:
    """Percentile ``q`` (0..100) in ms; nan without values."""
    found = percentile(values, q)
    return found * 1000 if found is not None else float("nan")


def added_interval(moved: list[float], base: list[float], q: float) -> str:
    """95% bootstrap interval (ms) of percentile ``q`` of routed transit minus that of
    direct transit: how well the run pins the added latency down."""
    if len(moved) < 2 or len(base) < 2:
        return "n/a"

    def difference(a: np.ndarray, b: np.ndarray, axis: int) -> np.ndarray:
        return percentile(a, q, axis=axis) - percentile(b, q, axis=axis)

    result = scipy.stats.bootstrap(
        (np.asarray(moved), np.asarray(base)),
        difference,
        n_resamples=2000,
        method="percentile",
        random_state=np.random.default_rng(0),
    )
    low, high = result.confidence_interval
    return f"[{low * 1000:.1f}, {high * 1000:.1f}]"


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
