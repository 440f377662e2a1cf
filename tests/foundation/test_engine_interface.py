"""engine_interface: vLLM /metrics parsing (current and older names, several
engines, bad input) and the shared load CV and percentile definitions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine_interface import (
    PREFIX_QUERIES,
    Histogram,
    load_cv,
    mean_load_cv,
    parse_metrics,
    percentile,
    read_histogram,
    read_samples,
    sample_total,
)
from tests.foundation.helpers import CURRENT, OLDER


def test_current_names_across_two_engines():
    parsed = parse_metrics(CURRENT)
    assert sorted(parsed.engines) == ["0", "1"]
    assert (parsed.running, parsed.waiting) == (5.0, 1.0)
    assert parsed.kv_usage == pytest.approx(0.5)  # the mean of the fractions, not the sum
    assert (parsed.prefix_queries, parsed.prefix_hits) == (150.0, 50.0)
    assert (parsed.num_gpu_blocks, parsed.block_size) == (2 * 81541, 16)
    assert parsed.engines["1"].kv_usage == 0.75
    ttft = parsed.histogram("ttft")
    assert ttft == Histogram(((0.1, 1.0), (1.0, 5.0), (math.inf, 6.0)), 9.0, 6.0)
    assert ttft.mean == pytest.approx(1.5)
    assert (ttft.quantile_bound(10), ttft.quantile_bound(50), ttft.quantile_bound(99)) == (
        0.1,
        1.0,
        math.inf,
    )
    assert parsed.skipped == 0
    assert parsed.summary() == {
        "running": 5.0,
        "waiting": 1.0,
        "kv_usage": 0.5,
        "prefix_queries": 150.0,
        "prefix_hits": 50.0,
        "engine_kv_blocks": 81541,  # each engine's (num_gpu_blocks: both together)
    }


def test_older_names_are_read_when_the_current_ones_are_absent():
    parsed = parse_metrics(OLDER)
    assert (parsed.running, parsed.kv_usage) == (4.0, 0.5)
    assert (parsed.prefix_queries, parsed.prefix_hits) == (200.0, 120.0)
    assert parsed.histogram("itl") == Histogram(((0.05, 10.0), (math.inf, 10.0)), 0.3, 10.0)
    assert parsed.waiting is None and parsed.histogram("ttft") is None


def test_the_current_name_wins_over_the_older_one():
    both = OLDER + 'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.125\n'
    assert parse_metrics(both).kv_usage == 0.125


def test_without_engine_label_and_without_type_lines():
    parsed = parse_metrics(
        'vllm:num_requests_running{model_name="m"} 2\nvllm:prefix_cache_hits_total 7\n'
    )
    assert list(parsed.engines) == ["0"]
    assert (parsed.running, parsed.prefix_hits) == (2.0, 7.0)


def test_histograms_can_be_left_out():
    parsed = parse_metrics(CURRENT, histograms=False)
    assert parsed.histogram("ttft") is None and parsed.running == 5.0


def test_the_scrape_without_histograms_still_reads_the_inter_token_latency_sum_and_count():
    # Flow control's step time: the deltas of ITL's _sum and _count between scrapes. The
    # router scrapes without histograms; the two lines are read, the buckets are not.
    parsed = parse_metrics(OLDER, histograms=False)
    assert parsed.itl_totals == (0.3, 10.0)
    assert parsed.histogram("itl") == Histogram((), 0.3, 10.0)
    two = "".join(
        f'vllm:inter_token_latency_seconds_{part}{{engine="{e}",model_name="m"}} {v}\n'
        for e, (total, count) in (("0", (1.5, 30)), ("1", (0.5, 10)))
        for part, v in (("sum", total), ("count", count))
    )
    assert parse_metrics(two, histograms=False).itl_totals == (2.0, 40.0)
    assert parse_metrics(two).itl_totals == (2.0, 40.0)
    assert parse_metrics(CURRENT, histograms=False).itl_totals is None  # not exported


@pytest.mark.parametrize(
    "bad_line",
    [
        'vllm:num_requests_waiting{engine="0",model_name="m} 9',  # unterminated label value
        "vllm:num_requests_waiting not-a-number",
        "vllm:num_requests_waiting{engine=0} 9",  # unquoted label value
        "vllm:num_requests_waiting NaN",
    ],
)
def test_a_bad_line_is_skipped_and_counted_the_rest_still_read(bad_line):
    parsed = parse_metrics(CURRENT + bad_line + "\n")
    assert parsed.skipped == 1
    assert (parsed.running, parsed.waiting, parsed.kv_usage) == (5.0, 1.0, 0.5)


def test_a_bad_bucket_bound_drops_that_histogram_only():
    text = CURRENT.replace(
        'le="1.0",model_name="Qwen/Qwen2-7B"} 2.0', 'le="soon",model_name="Qwen/Qwen2-7B"} 2.0'
    )
    parsed = parse_metrics(text)
    assert parsed.skipped == 1
    assert parsed.engines["1"].ttft is None and parsed.engines["0"].ttft is not None


@pytest.mark.parametrize(
    "text", ["", "\x00\x01\x02", "<html>502 Bad Gateway</html>", "vllm:num_requests_running{"]
)
def test_garbage_never_raises(text):
    parsed = parse_metrics(text)
    assert parsed.running is None and parsed.kv_usage is None


def test_read_samples_and_sample_total():
    samples, skipped = read_samples(CURRENT)
    assert skipped == 0
    assert sample_total(samples, "vllm:num_requests_running") == 5.0
    assert sample_total(samples, "vllm:num_requests_running", engine="1") == 2.0
    assert sample_total(samples, "vllm:no_such_metric") == 0.0
    assert sample_total(samples, PREFIX_QUERIES.total) == 150.0  # a counter's sample name


def test_histogram_since_an_earlier_scrape():
    earlier = Histogram(((1.0, 2.0), (math.inf, 3.0)), 4.0, 3.0)
    later = Histogram(((1.0, 5.0), (math.inf, 7.0)), 10.0, 7.0)
    assert later.since(earlier) == Histogram(((1.0, 3.0), (math.inf, 4.0)), 6.0, 4.0)
    assert Histogram().quantile_bound(50) is None


def test_percentile_is_numpy_with_q_in_0_100():
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 50) == 2.5 == float(np.percentile(values, 50))
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 4.0
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None and percentile(np.array([]), 50) is None
    with pytest.raises(ValueError, match=r"q must be in \[0, 100\], got 100.5"):
        percentile(values, 100.5)


def test_percentile_along_an_axis_is_the_percentile_of_each_slice():
    rows = np.array([[4.0, 1.0, 3.0, 2.0], [10.0, 30.0, 20.0, 40.0]])
    assert percentile(rows, 50, axis=-1).tolist() == [2.5, 25.0]
    assert percentile(rows, 100, axis=0).tolist() == [10.0, 30.0, 20.0, 40.0]
    assert percentile(rows[0], 50, axis=0) == percentile(rows[0], 50)
    with pytest.raises(ValueError, match="no values"):
        percentile(np.empty((3, 0)), 50, axis=-1)
    with pytest.raises(ValueError, match=r"q must be in \[0, 100\]"):
        percentile(rows, -1, axis=-1)


def test_load_cv_edge_cases():
    assert load_cv([300, 100]) == pytest.approx(0.5)
    assert load_cv([5]) == 0.0  # one loaded instance: balanced
    assert load_cv([]) is None
    assert load_cv([0, 0, 0]) is None  # no load to compare
    assert load_cv(np.array([2.0, 2.0])) == 0.0
    with pytest.raises(ValueError, match="one value per instance"):
        load_cv([[1, 2], [3, 4]])


def test_mean_load_cv_averages_the_instants_with_load():
    samples = np.array([[300, 100], [0, 0], [1, 1]])
    assert mean_load_cv(samples) == pytest.approx((0.5 + 0.0) / 2)
    assert mean_load_cv(np.zeros((3, 2))) is None
    assert mean_load_cv(np.zeros((0, 4))) is None


def test_read_histogram_merges_label_sets_and_filters():
    samples, _ = read_samples(CURRENT)
    name = "vllm:time_to_first_token_seconds"
    assert read_histogram(samples, name) == parse_metrics(CURRENT).histogram("ttft")
    merged = read_histogram(samples, name, engine="1")
    assert merged is not None and merged.count == 2.0
    assert read_histogram(samples, "vllm:no_such_histogram") is None
