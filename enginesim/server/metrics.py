"""Prometheus ``/metrics`` for one instance, with vLLM v1's names, labels and buckets.

The names are ``engine_interface``'s (the ones the router reads), so the
simulator cannot expose a name the router does not know.

Every metric carries ``model_name`` (the served model name) and ``engine``
(always ``"0"``: one engine core per server, as in a vLLM process without data
parallelism). Engine state (running/waiting, KV usage, prefix-cache counters,
preemptions) is read from the engine at scrape time; token counters and request
histograms are fed by the server as outputs are delivered, with vLLM's
semantics (``vllm:prompt_tokens`` adds the whole prompt, cached part included,
when the first token is out).

All latencies are in *simulated* seconds (the engine's virtual clock): they are
what a real vLLM on the simulated hardware would report, independent of
``--time-scale``. Wall seconds = simulated seconds x time scale; the factor is
exported as ``enginesim:time_scale`` for scrapers that want to compare.

With a global KV tier the engine also reports what vLLM reports with a KV connector
(LMCache, Mooncake): ``vllm:external_prefix_cache_queries`` / ``_hits`` (tokens asked of
the connector, tokens it supplied), plus the tier traffic vLLM has no name for:
``enginesim:kv_tier_read_bytes``, ``enginesim:kv_tier_read_seconds`` (step time spent
loading) and ``enginesim:kv_tier_read_wait_seconds`` (the part queued behind other
instances' reads on the shared link). Without a tier none of these is exported, as vLLM
exports no external counters without a connector.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

import engine_interface as ei

LABELS = ei.LABELS
ENGINE_INDEX = ei.DEFAULT_ENGINE
FINISH_REASONS = ("stop", "length", "abort")

TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
    50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip

# The NIXL histograms: transfer durations from 1 ms to 5 s, sizes in powers of 4 from 2 KiB.
XFER_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0)
BYTES_BUCKETS = tuple(float(2 ** (11 + 2 * k)) for k in range(12))


def buckets_1_2_5(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to max_value (vLLM's token-count buckets)."""
    out: list[int] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_value:
                return out
            out.append(mantissa * scale)
        scale *= 10


class SimpleHistogram:
    """A histogram that takes weighted observations (n tokens at once) cheaply.

    prometheus_client's Histogram takes a lock and walks the buckets per
    observation; at tens of thousands of tokens per second that is a sizeable
    share of the server's single core.
    """

    __slots__ = ("_bounds", "_counts", "doc", "name", "total")

    def __init__(self, name: str, doc: str, buckets: Sequence[float]) -> None:
        self.name = name
        self.doc = doc
        self._bounds = [float(b) for b in buckets]
        self._counts = [0] * (len(self._bounds) + 1)  # last = above every bound
        self.total = 0.0

    def observe(self, value: float, count: int = 1) -> None:
        self._counts[bisect.bisect_left(self._bounds, value)] += count
        self.total += value * count

    def family(self, label_values: list[str]) -> Metric:
        cumulative, buckets = 0, []
        for bound, count in zip([*self._bounds, float("inf")], self._counts, strict=True):
            cumulative += count
            buckets.append((floatToGoString(bound), cumulative))
        family = HistogramMetricFamily(self.name, self.doc, labels=LABELS)
        family.add_metric(label_values, buckets, sum_value=self.total)
        return family


class _EngineStateCollector:
    """Gauges and counters read from ``EngineStats`` on each scrape."""

    def __init__(
        self,
        label_values: list[str],
        stats_fn: Callable[[], Any],
        cache_info: Mapping[str, str],
        time_scale_fn: Callable[[], float],
        kv_connector: bool = False,
    ) -> None:
        self.label_values = label_values
        self.kv_connector = kv_connector
        self._stats_fn = stats_fn
        self._cache_info = dict(cache_info)
        self._time_scale_fn = time_scale_fn

    def _gauge(self, name: str, doc: str, value: float) -> Metric:
        family = GaugeMetricFamily(name, doc, labels=LABELS)
        family.add_metric(self.label_values, value)
        return family

    def _counter(self, name: str, doc: str, value: float) -> Metric:
        family = CounterMetricFamily(name, doc, labels=LABELS)
        family.add_metric(self.label_values, value)
        return family

    def collect(self) -> Iterator[Metric]:
        stats = self._stats_fn()
        yield self._gauge(
            ei.RUNNING.name,
            "Number of requests in model execution batches.",
            stats.num_running,
        )
        yield self._gauge(
            ei.WAITING.name,
            "Number of requests waiting to be processed.",
            stats.num_waiting,
        )
        yield self._gauge(
            ei.KV_USAGE.name, "KV-cache usage. 1 means 100 percent usage.", stats.kv_usage
        )
        yield self._counter(
            ei.PREFIX_QUERIES.name,
            "Prefix cache queries, in terms of number of queried tokens.",
            stats.prefix_cache_queries,
        )
        yield self._counter(
            ei.PREFIX_HITS.name,
            "Prefix cache hits, in terms of number of cached tokens.",
            stats.prefix_cache_hits,
        )
        yield self._counter(
            ei.PREEMPTIONS.name,
            "Cumulative number of preemption from the engine.",
            stats.num_preemptions,
        )
        if stats.has_tier:
            yield from self._tier(stats)
        if self.kv_connector:
            yield from self._transfer(stats.transfer)
        info = GaugeMetricFamily(
            ei.CACHE_CONFIG_INFO.name,
            "Information of the LLMEngine CacheConfig",
            labels=[*self._cache_info, ei.ENGINE_LABEL],
        )
        info.add_metric([*self._cache_info.values(), ENGINE_INDEX], 1.0)
        yield info
        yield GaugeMetricFamily(
            "enginesim:time_scale",
            "Wall seconds per simulated second (latencies here are simulated seconds).",
            value=self._time_scale_fn(),
        )

    def _transfer(self, transfer: Any) -> Iterator[Metric]:
        yield self._gauge(
            ei.KV_HELD_REQUESTS.name,
            "Finished prefills whose KV blocks are held for a decode instance to read.",
            transfer.held_requests,
        )
        yield self._gauge(
            ei.KV_HELD_BLOCKS.name, "KV blocks held for decode instances.", transfer.held_blocks
        )
        yield self._counter(
            ei.KV_HOLDS_EXPIRED.name,
            "Held prefills freed by the timeout, never read.",
            transfer.expired,
        )
        yield self._gauge(
            ei.KV_TRANSFERS_IN_FLIGHT.name,
            "Remote prefills this instance is reading (or waiting for room to read).",
            transfer.in_flight,
        )

    def _tier(self, stats: Any) -> Iterator[Metric]:
        yield self._counter(
            ei.EXTERNAL_PREFIX_QUERIES.name,
            "External prefix cache queries from KV connector cross-instance cache sharing, "
            "in terms of number of queried tokens.",
            stats.prefix_cache_queries,
        )
        yield self._counter(
            ei.EXTERNAL_PREFIX_HITS.name,
            "External prefix cache hits from KV connector cross-instance cache sharing, "
            "in terms of number of cached tokens.",
            stats.external_cache_hits,
        )
        yield self._counter(
            ei.TIER_READ_BYTES.name,
            "Bytes of KV cache loaded from the global tier.",
            stats.tier_bytes_read,
        )
        yield self._counter(
            ei.TIER_READ_SECONDS.name,
            "Step time spent loading KV cache from the global tier (simulated seconds).",
            stats.tier_read_time,
        )
        yield self._counter(
            ei.TIER_READ_WAIT_SECONDS.name,
            "Of kv_tier_read_seconds, the time queued behind other instances' tier reads.",
            stats.tier_read_wait,
        )


class ServerMetrics:
    """Everything behind one instance's ``/metrics``."""

    def __init__(
        self,
        model_name: str,
        max_model_len: int,
        cache_info: Mapping[str, str],
        stats_fn: Callable[[], Any],
        time_scale_fn: Callable[[], float],
        kv_connector: bool = False,
    ) -> None:
        self.label_values = [model_name, ENGINE_INDEX]
        self.kv_connector = kv_connector
        self.xfer_time = SimpleHistogram(
            ei.NIXL_XFER_TIME.name, "Histogram of transfer duration for KV cache.", XFER_BUCKETS
        )
        self.xfer_bytes = SimpleHistogram(
            ei.NIXL_BYTES.name,
            "Histogram of number of bytes transferred per KV cache transfer.",
            BYTES_BUCKETS,
        )
        self.failed_transfers = 0
        token_buckets = buckets_1_2_5(max_model_len)
        self.ttft = SimpleHistogram(
            ei.TTFT.name,
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        )
        self.itl = SimpleHistogram(
            ei.ITL.name,
            "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
        )
        self.tpot = SimpleHistogram(
            ei.TPOT_DEPRECATED.name,
            "Histogram of time per output token in seconds."
            "DEPRECATED: Use vllm:inter_token_latency_seconds instead.",
            ITL_BUCKETS,
        )
        self.request_tpot = SimpleHistogram(
            ei.REQUEST_TPOT.name,
            "Histogram of time_per_output_token_seconds per request.",
            ITL_BUCKETS,
        )
        self.e2e = SimpleHistogram(
            ei.E2E_LATENCY.name,
            "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.prompt_len = SimpleHistogram(
            ei.REQUEST_PROMPT_TOKENS.name, "Number of prefill tokens processed.", token_buckets
        )
        self.generation_len = SimpleHistogram(
            ei.REQUEST_GENERATION_TOKENS.name,
            "Number of generation tokens processed.",
            token_buckets,
        )
        self.max_tokens_param = SimpleHistogram(
            ei.REQUEST_MAX_TOKENS.name,
            "Histogram of the max_tokens request parameter.",
            token_buckets,
        )
        # vLLM counts a request's whole prompt (cached part included) at its first token.
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.success = dict.fromkeys(FINISH_REASONS, 0)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_ServerCollector(self))
        self.registry.register(
            _EngineStateCollector(
                self.label_values, stats_fn, cache_info, time_scale_fn, kv_connector
            )
        )

    def histograms(self) -> list[SimpleHistogram]:
        return [
            self.ttft, self.itl, self.tpot, self.request_tpot, self.e2e,
            self.prompt_len, self.generation_len, self.max_tokens_param,
        ]  # fmt: skip

    def observe_transfer(self, num_bytes: int, seconds: float) -> None:
        self.xfer_bytes.observe(num_bytes)
        self.xfer_time.observe(seconds)

    def observe_first_token(self, ttft: float, prompt_tokens: int) -> None:
        self.ttft.observe(ttft)
        self.prompt_tokens += prompt_tokens
        self.generation_tokens += 1

    def observe_decode(self, interval: float, num_tokens: int) -> None:
        """``num_tokens`` tokens produced evenly over ``interval`` simulated seconds."""
        self.generation_tokens += num_tokens
        per_token = interval / num_tokens
        self.itl.observe(per_token, num_tokens)
        self.tpot.observe(per_token, num_tokens)

    def observe_finished(
        self,
        reason: str,
        e2e: float,
        prompt_tokens: int,
        generation_tokens: int,
        max_tokens: int | None,
        decode_time: float,
    ) -> None:
        self.success[reason] += 1
        self.e2e.observe(e2e)
        self.prompt_len.observe(prompt_tokens)
        self.generation_len.observe(generation_tokens)
        if max_tokens:
            self.max_tokens_param.observe(max_tokens)
        if generation_tokens > 1:
            self.request_tpot.observe(decode_time / (generation_tokens - 1))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _ServerCollector:
    """Counters and histograms the server feeds."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self._metrics
        lv = m.label_values
        for name, doc, total in (
            (ei.PROMPT_TOKENS.name, "Number of prefill tokens processed.", m.prompt_tokens),
            (ei.GENERATION_TOKENS.name, "Number of generation tokens processed.",
             m.generation_tokens),
        ):  # fmt: skip
            family = CounterMetricFamily(name, doc, labels=LABELS)
            family.add_metric(lv, total)
            yield family
        success = CounterMetricFamily(
            ei.REQUEST_SUCCESS.name,
            "Count of successfully processed requests.",
            labels=[*LABELS, "finished_reason"],
        )
        for reason, count in m.success.items():
            success.add_metric([*lv, reason], count)
        yield success
        for histogram in m.histograms():
            yield histogram.family(lv)
        if m.kv_connector:
            yield m.xfer_time.family(lv)
            yield m.xfer_bytes.family(lv)
            failed = CounterMetricFamily(
                ei.NIXL_FAILED.name, "Number of failed KV cache transfers.", labels=LABELS
            )
            failed.add_metric(lv, m.failed_transfers)
            yield failed
