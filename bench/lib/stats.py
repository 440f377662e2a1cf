"""What the runs measured: transit times, percentiles with bootstrap intervals, and the
router's own histograms from its Prometheus ``/metrics``."""

from __future__ import annotations

import httpx
import numpy as np
import scipy.stats
from prometheus_client.parser import text_string_to_metric_families

from bench.lib.loadclient import Run


def transit(run: Run, engine_ttft: dict[str, float]) -> list[float]:
    """Per stream: client-observed TTFT minus the engine's own TTFT (s). What the path
    between client and engine costs — loopback, the client's and the engine's socket
    handling, and in routed runs everything the router adds (its CPU, its event loop's
    queue) — without the engine's queueing and prefill, which vary with load and
    placement and would swamp a millisecond."""
    return [o.first - o.sent - engine_ttft[o.request_id] for o in run.outcomes
            if o.first is not None and o.request_id in engine_ttft]


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1000 if values else float("nan")


def added_interval(moved: list[float], base: list[float], q: float) -> str:
    """95% bootstrap interval (ms) of percentile ``q`` of routed transit minus that of
    direct transit: how well the run pins the added latency down."""
    if len(moved) < 2 or len(base) < 2:
        return "n/a"

    def difference(a: np.ndarray, b: np.ndarray, axis: int) -> np.ndarray:
        return np.percentile(a, q, axis=axis) - np.percentile(b, q, axis=axis)

    result = scipy.stats.bootstrap((np.asarray(moved), np.asarray(base)), difference,
                                   n_resamples=2000, method="percentile",
                                   random_state=np.random.default_rng(0))
    low, high = result.confidence_interval
    return f"[{low * 1000:.1f}, {high * 1000:.1f}]"


HOT_PATH = ("tokenize", "hashing", "decision", "overhead", "loop_lag")


def router_histograms(port: int) -> dict[str, float]:
    """Sums, counts and cumulative buckets of the router's hot-path histograms, summed over
    their labels: ``{name}_sum``, ``{name}_count`` and ``{name}_le_{bound}``."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    wanted = {f"switchyard_router_{name}_seconds": name for name in HOT_PATH}
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        name = wanted.get(family.name)
        for sample in family.samples if name else ():
            kind = sample.name.rsplit("_", 1)[1]
            if kind == "bucket":
                key = f"{name}_le_{sample.labels['le']}"
            elif kind in ("sum", "count"):
                key = f"{name}_{kind}"
            else:
                continue
            out[key] = out.get(key, 0.0) + sample.value
    return out


def bucket_quantile(before: dict[str, float], after: dict[str, float], name: str,
                    q: float = 0.5) -> float:
    """Upper bound (s) of the bucket holding quantile ``q`` of the observations between
    two scrapes (inf when it lies beyond the last bucket, nan without observations)."""
    prefix = f"{name}_le_"
    bounds = sorted((float(k[len(prefix):]), k) for k in after if k.startswith(prefix))
    total = after[f"{name}_count"] - before.get(f"{name}_count", 0.0)
    if total <= 0:
        return float("nan")
    for bound, key in bounds:
        if after[key] - before.get(key, 0.0) >= q * total:
            return bound
    return float("inf")
