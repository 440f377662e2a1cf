"""The pure parts of bench/demo_health/run.py: TTFT percentiles from the difference of two
scrapes of a histogram, the busy fraction from samples, the demo's process tree."""

import math

import pytest

from bench.demo_health.run import busy_fraction, descendants, histogram_quantile
from engine_interface import Histogram

START = Histogram(((0.1, 1), (0.5, 2), (1.0, 2), (math.inf, 2)), sum=0.5, count=2)
END = Histogram(((0.1, 2), (0.5, 6), (1.0, 10), (math.inf, 10)), sum=6.0, count=10)
# the window's 8 observations: 1 in (0, 0.1], 3 in (0.1, 0.5], 4 in (0.5, 1.0]


@pytest.mark.parametrize(
    ("q", "expected"),
    [
        (10, 0.08),  # rank 0.8 of 1 in the first bucket, from 0: 0.1 * 0.8
        (25, 0.1 + 0.4 * 1 / 3),  # rank 2: the 1st of 3 in (0.1, 0.5]
        (75, 0.75),  # rank 6: the 2nd of 4 in (0.5, 1.0]
        (100, 1.0),
    ],
)
def test_percentiles_interpolate_within_the_buckets_of_the_window(q, expected):
    assert histogram_quantile(END.since(START), q) == pytest.approx(expected)


def test_a_percentile_beyond_the_last_finite_bound_is_infinite():
    end = Histogram(((0.1, 2), (0.5, 6), (1.0, 10), (math.inf, 12)), sum=9.0, count=12)
    window = end.since(START)  # 10 observations, 2 of them above 1.0
    assert histogram_quantile(window, 79) == pytest.approx(0.5 + 0.5 * (7.9 - 4) / 4)
    assert histogram_quantile(window, 81) == math.inf


def test_a_window_without_observations_has_no_percentile():
    assert histogram_quantile(START.since(START), 50) is None


def test_busy_fraction_is_the_share_of_samples_with_a_request_running():
    assert busy_fraction([0, 1, 2, 0, 0.0, 3]) == 0.5
    assert busy_fraction([0, 0]) == 0.0
    assert busy_fraction([]) is None


def test_the_demos_processes_are_the_tree_under_its_pid():
    table = {1: (0, "init"), 2: (1, "demo"), 3: (2, "engines"), 4: (3, "pool"), 5: (1, "other")}
    assert descendants({2}, table) == {2, 3, 4}
    assert descendants({99}, table) == set()
