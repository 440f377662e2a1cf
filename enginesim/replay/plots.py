"""PNG plots of replay results (matplotlib, Agg backend, small files)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from enginesim.replay.metrics import ttfts
from enginesim.replay.simulator import SimResult

DPI = 72


def ttft_cdf(
    results: Sequence[SimResult], path: Path, title: str = "", lower_bound: np.ndarray | None = None
) -> Path:
    """One TTFT CDF per policy (log x axis), the lower bound dashed."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    curves = [(r.policy, ttfts(r.requests), "-") for r in results]
    if lower_bound is not None:
        curves.append(("lower bound", lower_bound, "--"))
    for label, values, style in curves:
        values = np.sort(values[values > 0])
        if len(values):
            ax.plot(values, np.arange(1, len(values) + 1) / len(values), style, label=label)
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(title or "TTFT CDF")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return save(fig, path)


def pending_over_time(result: SimResult, path: Path, title: str = "") -> Path:
    """Per-instance pending prefill tokens at each scrape tick (one thin line each)."""
    fig, ax = plt.subplots(figsize=(7, 3.2))
    samples = result.pending_samples
    for column in range(samples.shape[1] if samples.ndim == 2 else 0):
        ax.plot(result.sample_times, samples[:, column], linewidth=0.6)
    ax.set_xlabel("virtual time (s)")
    ax.set_ylabel("pending prefill tokens")
    ax.set_title(title or f"{result.policy}: pending prefill per instance")
    ax.grid(True, alpha=0.3)
    return save(fig, path)


def save(fig: plt.Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path
