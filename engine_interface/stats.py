"""The statistics the router computes and every report shares (router, control plane,
replay, benches): percentiles and the load imbalance across instances. numpy only: a router
host installs no scipy. The confidence intervals the reports give are
``enginesim.stats``'s."""

from __future__ import annotations

from typing import overload

import numpy as np
from numpy.typing import ArrayLike


def _check_q(q: float) -> None:
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in [0, 100], got {q!r}")


@overload
def percentile(values: ArrayLike, q: float, *, axis: None = None) -> float | None: ...


@overload
def percentile(values: ArrayLike, q: float, *, axis: int) -> np.ndarray: ...


def percentile(
    values: ArrayLike, q: float, *, axis: int | None = None
) -> float | np.ndarray | None:
    """The ``q``-th percentile, **q in [0, 100]** as in numpy, with numpy's default
    linear interpolation between order statistics (``q=50``: the median); None for no
    values. With ``axis``: the percentile of each slice along that axis, as an array (a
    bootstrap's resamples); the slices must not be empty."""
    _check_q(q)
    array = np.asarray(values, dtype=float)
    if axis is None:
        return float(np.percentile(array, q)) if array.size else None
    if not array.size:
        raise ValueError("percentile along an axis of no values")
    return np.asarray(np.percentile(array, q, axis=axis))


def _row_cvs(rows: np.ndarray) -> np.ndarray:
    """Population stddev / mean of each row whose mean is positive (the others have no
    load to compare and are left out)."""
    means = rows.mean(axis=1)
    busy = means > 0
    return rows[busy].std(axis=1) / means[busy]


def load_cv(values: ArrayLike) -> float | None:
    """Load imbalance across instances at one moment: population stddev / mean of their
    loads (e.g. pending prefill tokens). 0.0 for a single loaded instance; None for no
    instances or no load (mean ≤ 0)."""
    array = np.asarray(values, dtype=float)
    if array.ndim != 1:
        raise ValueError(f"load_cv takes one value per instance, got shape {array.shape}")
    cvs = _row_cvs(array[None, :]) if array.size else array
    return float(cvs[0]) if cvs.size else None


def mean_load_cv(samples: np.ndarray) -> float | None:
    """:func:`load_cv` of each sample (rows: instants; columns: instances), averaged over
    the samples where it is defined; None if it is defined at none."""
    if samples.size == 0:
        return None
    if samples.ndim != 2:
        raise ValueError(f"mean_load_cv takes instants × instances, got shape {samples.shape}")
    cvs = _row_cvs(samples)
    return float(cvs.mean()) if cvs.size else None
