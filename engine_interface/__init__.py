"""What Switchyard knows of vLLM's public interface, in one place.

* Metric names of vLLM's Prometheus ``/metrics`` (``vllm/v1/metrics/loggers.py``): the
  current name of each metric and the names older releases used for it (vLLM 0.9 renamed
  ``vllm:gpu_cache_usage_perc`` → ``vllm:kv_cache_usage_perc`` and
  ``vllm:gpu_prefix_cache_{queries,hits}`` → ``vllm:prefix_cache_{queries,hits}``; later
  releases renamed ``vllm:time_per_output_token_seconds`` →
  ``vllm:inter_token_latency_seconds``). enginesim exposes the current names; readers
  fall back to an older name only when the current one is absent for that engine.
* :func:`parse_metrics`: one scrape → :class:`ScrapedMetrics`, one
  :class:`EngineMetrics` per vLLM engine core (the ``engine`` label: data-parallel ranks
  behind one API server). Built on ``prometheus_client``'s text parser; lines it cannot
  read are skipped and counted (``ScrapedMetrics.skipped``), never raised.
* Aggregation, decided here once: running/waiting requests, prefix-cache counters, KV
  blocks and the KV transfers of disaggregation (reads in flight, bytes read, failed
  reads) are summed over an instance's engines; KV usage is the *mean* of the engines'
  fractions (each engine's cache is the same size, so this is the instance's fraction). A
  cluster-wide KV usage is likewise the mean of per-instance fractions.
* :mod:`engine_interface.stats`: the load balance (:func:`load_cv` / :func:`mean_load_cv`)
  and latency (:func:`percentile`) statistics every report (router, control plane, replay,
  benches) computes; the confidence intervals the pages and benches give are
  ``enginesim.stats``'s (scipy: not on a router host).
* :mod:`engine_interface.kv_events`: constants of vLLM's KV-event ZMQ protocol (a module of
  its own, free of the parser's dependencies, so that the pure routing code may import it).

A package of its own, importing neither side (enginesim's server imports nothing of
router_worker, and the router nothing of enginesim: docs/architecture.md, "Layers and
their rules"): the router, the control plane,
enginesim and the benches import it. No Django, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

# The statistics every report computes live in engine_interface.stats; these three are
# re-exported here, where the router and the benches have always imported them.
from engine_interface.stats import _check_q
from engine_interface.stats import load_cv as load_cv
from engine_interface.stats import mean_load_cv as mean_load_cv
from engine_interface.stats import percentile as percentile


@dataclass(frozen=True)
class MetricName:
    """A vLLM metric: its current name and the names older vLLM releases used (newest
    first). Counters are named without ``_total`` (the exposition appends it)."""

    name: str
    older: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.older)

    @property
    def total(self) -> str:
        """A counter's sample name (the exposition appends ``_total``)."""
        return self.name + "_total"


RUNNING = MetricName("vllm:num_requests_running")
WAITING = MetricName("vllm:num_requests_waiting")
KV_USAGE = MetricName("vllm:kv_cache_usage_perc", ("vllm:gpu_cache_usage_perc",))
PREFIX_QUERIES = MetricName("vllm:prefix_cache_queries", ("vllm:gpu_prefix_cache_queries",))
PREFIX_HITS = MetricName("vllm:prefix_cache_hits", ("vllm:gpu_prefix_cache_hits",))
PREEMPTIONS = MetricName("vllm:num_preemptions")
PROMPT_TOKENS = MetricName("vllm:prompt_tokens")
GENERATION_TOKENS = MetricName("vllm:generation_tokens")
REQUEST_SUCCESS = MetricName("vllm:request_success")  # label finished_reason
CACHE_CONFIG_INFO = MetricName("vllm:cache_config_info")  # labels num_gpu_blocks, block_size
TTFT = MetricName("vllm:time_to_first_token_seconds")
ITL = MetricName("vllm:inter_token_latency_seconds", ("vllm:time_per_output_token_seconds",))
# The deprecated per-token histogram enginesim still exposes beside ITL, as vLLM does.
TPOT_DEPRECATED = MetricName("vllm:time_per_output_token_seconds")
REQUEST_TPOT = MetricName("vllm:request_time_per_output_token_seconds")
E2E_LATENCY = MetricName("vllm:e2e_request_latency_seconds")
REQUEST_PROMPT_TOKENS = MetricName("vllm:request_prompt_tokens")
REQUEST_GENERATION_TOKENS = MetricName("vllm:request_generation_tokens")
REQUEST_MAX_TOKENS = MetricName("vllm:request_params_max_tokens")
# A global KV tier (a KV connector: LMCache, Mooncake; enginesim's GlobalKVTier): prompt
# tokens asked of it and found there. vLLM has no standard name for the bytes moved, so
# those are enginesim's own; a real vLLM leaves them unknown. Engines without a connector
# export none of these, which is how the live view knows a cluster has no tier.
EXTERNAL_PREFIX_QUERIES = MetricName("vllm:external_prefix_cache_queries")
EXTERNAL_PREFIX_HITS = MetricName("vllm:external_prefix_cache_hits")
TIER_READ_BYTES = MetricName("enginesim:kv_tier_read_bytes")
TIER_READ_SECONDS = MetricName("enginesim:kv_tier_read_seconds")
TIER_READ_WAIT_SECONDS = MetricName("enginesim:kv_tier_read_wait_seconds")

# Prefill/decode disaggregation: vLLM's NIXL connector reports its reads (on the decode
# side, which reads) as these; what a prefill instance holds for readers, and the reads
# under way, vLLM does not export, so those names are enginesim's own.
NIXL_XFER_TIME = MetricName("vllm:nixl_xfer_time_seconds")  # histogram
NIXL_BYTES = MetricName("vllm:nixl_bytes_transferred")  # histogram
NIXL_FAILED = MetricName("vllm:nixl_num_failed_transfers")  # counter
KV_HELD_REQUESTS = MetricName("enginesim:kv_held_requests")
KV_HELD_BLOCKS = MetricName("enginesim:kv_held_blocks")
KV_HOLDS_EXPIRED = MetricName("enginesim:kv_holds_expired")  # counter
KV_TRANSFERS_IN_FLIGHT = MetricName("enginesim:kv_transfers_in_flight")
# The bytes histogram's sum: every byte the instance has read since its start (a counter).
NIXL_BYTES_SUM = MetricName(NIXL_BYTES.name + "_sum")

MODEL_LABEL = "model_name"
ENGINE_LABEL = "engine"
LABELS = (MODEL_LABEL, ENGINE_LABEL)
DEFAULT_ENGINE = "0"  # what an exposition without the engine label describes


# ----------------------------------------------------------------- raw samples


def read_samples(text: str, names: Sequence[str] | None = None) -> tuple[list[Sample], int]:
    """The samples of a Prometheus text exposition (only those of series whose name starts
    with one of ``names``, if given), and how many of those lines were skipped as
    unreadable. Filtering first matters: prometheus_client's parser reads labels a
    character at a time, and a vLLM exposition is mostly histogram buckets."""
    if names is not None:
        wanted = tuple(names)
        text = "\n".join(line for line in text.splitlines() if line.startswith(wanted))
        text += "\n" if text else ""
    try:
        return _samples(text), 0
    except ValueError:
        pass  # some line is bad: read them one at a time, skipping the bad ones
    samples: list[Sample] = []
    skipped = 0
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        try:
            samples.extend(_samples(line + "\n"))
        except ValueError:
            skipped += 1
    return samples, skipped


def _samples(text: str) -> list[Sample]:
    try:
        return [s for family in text_string_to_metric_families(text) for s in family.samples]
    except (IndexError, KeyError, TypeError) as error:  # the parser's other complaints
        raise ValueError(str(error)) from error


def sample_total(samples: Iterable[Sample], name: str, **labels: str) -> float:
    """Sum of the samples named ``name`` whose labels include ``labels`` (0 if none)."""
    return float(
        sum(
            s.value
            for s in samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        )
    )


# ----------------------------------------------------------------- histograms


@dataclass(frozen=True)
class Histogram:
    """A Prometheus histogram: cumulative counts per upper bound (ascending, ``+Inf``
    last), the sum and the count of the observations."""

    buckets: tuple[tuple[float, float], ...] = ()
    sum: float = 0.0
    count: float = 0.0

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None

    def merged(self, other: Histogram) -> Histogram:
        """Both histograms' observations together (engines of one instance; buckets at
        bounds only one side has are dropped)."""
        theirs = dict(other.buckets)
        buckets = tuple((le, n + theirs[le]) for le, n in self.buckets if le in theirs)
        return Histogram(buckets, self.sum + other.sum, self.count + other.count)

    def since(self, earlier: Histogram) -> Histogram:
        """The observations made between ``earlier`` and this scrape of one series."""
        before = dict(earlier.buckets)
        buckets = tuple((le, n - before.get(le, 0.0)) for le, n in self.buckets)
        return Histogram(buckets, self.sum - earlier.sum, self.count - earlier.count)

    def quantile_bound(self, q: float) -> float | None:
        """Upper bound of the bucket holding the ``q``-th percentile (q in [0, 100]):
        ``inf`` when it lies beyond the last finite bound, None without observations."""
        _check_q(q)
        if self.count <= 0:
            return None
        for le, cumulative in self.buckets:
            if cumulative >= q / 100 * self.count:
                return le
        return math.inf


class _HistogramBuilder:
    def __init__(self) -> None:
        self.buckets: dict[float, float] = {}
        self.sum = 0.0
        self.count = 0.0
        self.bad = False

    def build(self) -> Histogram:
        return Histogram(tuple(sorted(self.buckets.items())), self.sum, self.count)


def read_histogram(samples: Iterable[Sample], name: str, **labels: str) -> Histogram | None:
    """Histogram ``name`` from raw samples, every series whose labels include ``labels``
    merged (None if it has no samples, or a bucket bound that is not a number)."""
    builders: dict[str, _HistogramBuilder] = {}
    for sample in samples:
        if all(sample.labels.get(k) == v for k, v in labels.items()):
            _add_histogram_sample(builders, sample, (name,))
    builder = builders.get(name)
    return builder.build() if builder is not None and not builder.bad else None


# ----------------------------------------------------------------- typed snapshot


@dataclass
class EngineMetrics:
    """What one vLLM engine core reports (None: not in the exposition)."""

    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None  # fraction of the engine's KV blocks in use, 0..1
    prefix_queries: float | None = None  # cumulative prompt tokens looked up
    prefix_hits: float | None = None  # cumulative prompt tokens found cached
    preemptions: float | None = None
    tier_hit_tokens: float | None = None  # None: the engine has no global tier
    tier_bytes_read: float | None = None
    kv_transfers_in_flight: float | None = None  # None: no KV connector (not disaggregated)
    kv_bytes_transferred: float | None = None  # cumulative bytes read from prefill instances
    kv_failed_transfers: float | None = None  # cumulative reads that failed
    num_gpu_blocks: int | None = None
    block_size: int | None = None
    ttft: Histogram | None = None
    itl: Histogram | None = None
    e2e: Histogram | None = None


@dataclass
class ScrapedMetrics:
    """One scrape of an instance's ``/metrics``: its engines, keyed by ``engine`` label."""

    engines: dict[str, EngineMetrics] = field(default_factory=dict)
    skipped: int = 0  # exposition lines that could not be read

    def _values(self, attribute: str) -> list[Any]:
        return [v for e in self.engines.values() if (v := getattr(e, attribute)) is not None]

    def _sum(self, attribute: str) -> float | None:
        values = self._values(attribute)
        return float(sum(values)) if values else None

    @property
    def running(self) -> float | None:
        return self._sum("running")

    @property
    def waiting(self) -> float | None:
        return self._sum("waiting")

    @property
    def kv_usage(self) -> float | None:
        """Mean of the engines' fractions (equal-sized caches: the instance's fraction)."""
        values = self._values("kv_usage")
        return sum(values) / len(values) if values else None

    @property
    def prefix_queries(self) -> float | None:
        return self._sum("prefix_queries")

    @property
    def prefix_hits(self) -> float | None:
        return self._sum("prefix_hits")

    @property
    def preemptions(self) -> float | None:
        """Requests the engines evicted from their KV cache to recompute later, since
        their start (a counter)."""
        return self._sum("preemptions")

    @property
    def tier_hit_tokens(self) -> float | None:
        return self._sum("tier_hit_tokens")

    @property
    def tier_bytes_read(self) -> float | None:
        return self._sum("tier_bytes_read")

    @property
    def kv_transfers_in_flight(self) -> float | None:
        """KV reads under way from prefill instances (disaggregation)."""
        return self._sum("kv_transfers_in_flight")

    @property
    def kv_bytes_transferred(self) -> float | None:
        """Bytes of KV read from prefill instances since the engines' start."""
        return self._sum("kv_bytes_transferred")

    @property
    def kv_failed_transfers(self) -> float | None:
        """KV reads that failed since the engines' start (a counter)."""
        return self._sum("kv_failed_transfers")

    @property
    def num_gpu_blocks(self) -> int | None:
        """KV blocks of all engines together (each holds its own prefix cache)."""
        values = self._values("num_gpu_blocks")
        return sum(values) if values else None

    @property
    def block_size(self) -> int | None:
        values = self._values("block_size")
        return values[0] if values else None

    def histogram(self, attribute: str) -> Histogram | None:
        """``ttft``, ``itl`` or ``e2e`` of all engines merged."""
        return merge_histograms(self._values(attribute))

    @property
    def itl_totals(self) -> tuple[float, float] | None:
        """``vllm:inter_token_latency_seconds``' ``_sum`` and ``_count`` over the engines
        (read even without the histograms: their deltas between two scrapes are the mean
        step time the engines ran at, flow control's TPOT signal); None if not exported."""
        found = self._values("itl")
        if not found:
            return None
        return float(sum(h.sum for h in found)), float(sum(h.count for h in found))

    def summary(self) -> dict[str, float]:
        """The gauges and counters that are present, JSON-ready (the control plane's
        ``Instance.last_scrape``)."""
        fields = ("running", "waiting", "kv_usage", "prefix_queries", "prefix_hits")
        values = {name: getattr(self, name) for name in fields}
        # the smallest engine's KV blocks: what a replay gives each simulated engine
        values["engine_kv_blocks"] = min(self._values("num_gpu_blocks"), default=None)
        return {name: value for name, value in values.items() if value is not None}


_GAUGES = {
    "running": RUNNING,
    "waiting": WAITING,
    "kv_usage": KV_USAGE,
    "kv_transfers_in_flight": KV_TRANSFERS_IN_FLIGHT,
}
_COUNTERS = {
    "prefix_queries": PREFIX_QUERIES,
    "prefix_hits": PREFIX_HITS,
    "preemptions": PREEMPTIONS,
    "tier_hit_tokens": EXTERNAL_PREFIX_HITS,
    "tier_bytes_read": TIER_READ_BYTES,
    "kv_bytes_transferred": NIXL_BYTES_SUM,
    "kv_failed_transfers": NIXL_FAILED,
}
_HISTOGRAMS = {"ttft": TTFT, "itl": ITL, "e2e": E2E_LATENCY}


def parse_metrics(text: str, *, histograms: bool = True) -> ScrapedMetrics:
    """The metrics Switchyard uses from one vLLM ``/metrics`` exposition (without the
    latency histograms if ``histograms`` is false: the router's scrape, several times a
    second, needs none). Never raises on bad input: unreadable lines of those metrics, and
    samples with a non-finite value or a bad bucket bound, are counted in ``skipped``."""
    wanted = [*_GAUGES.values(), *_COUNTERS.values(), CACHE_CONFIG_INFO]
    if histograms:
        wanted += _HISTOGRAMS.values()
    prefixes = [n for metric in wanted for n in metric.names]
    if not histograms:  # ITL's sum and count without its buckets (flow control's step time)
        prefixes += [n + part for n in ITL.names for part in ("_sum", "_count")]
    samples, skipped = read_samples(text, prefixes)
    histogram_names = [n for metric in _HISTOGRAMS.values() for n in metric.names]
    scalars: dict[str, dict[str, float]] = {}  # engine -> sample name -> value
    builders: dict[str, dict[str, _HistogramBuilder]] = {}
    out = ScrapedMetrics(skipped=skipped)
    for sample in samples:
        engine = sample.labels.get(ENGINE_LABEL) or DEFAULT_ENGINE
        if sample.name == CACHE_CONFIG_INFO.name:
            info = out.engines.setdefault(engine, EngineMetrics())
            info.num_gpu_blocks = _int(sample.labels.get("num_gpu_blocks"))
            info.block_size = _int(sample.labels.get("block_size"))
        elif not math.isfinite(sample.value):
            out.skipped += 1
        elif not _add_histogram_sample(builders.setdefault(engine, {}), sample, histogram_names):
            names = scalars.setdefault(engine, {})
            names[sample.name] = names.get(sample.name, 0.0) + sample.value
    for engine in sorted(scalars.keys() | builders.keys()):
        _fill(
            out.engines.setdefault(engine, EngineMetrics()),
            scalars.get(engine, {}),
            builders.get(engine, {}),
        )
    out.skipped += sum(b.bad for h in builders.values() for b in h.values())
    return out


def _add_histogram_sample(
    builders: dict[str, _HistogramBuilder], sample: Sample, names: Sequence[str]
) -> bool:
    """Adds a ``_bucket``/``_sum``/``_count`` sample of one of the histograms ``names``;
    False for any other sample."""
    base, _, part = sample.name.rpartition("_")
    if part not in ("bucket", "sum", "count") or base not in names:
        return False
    builder = builders.setdefault(base, _HistogramBuilder())
    if part == "sum":
        builder.sum += sample.value
    elif part == "count":
        builder.count += sample.value
    else:
        try:
            le = float(sample.labels["le"])
        except (KeyError, ValueError):
            builder.bad = True  # the series is unreadable: counted as skipped, dropped
            return True
        builder.buckets[le] = builder.buckets.get(le, 0.0) + sample.value
    return True


def _fill(
    metrics: EngineMetrics, scalars: dict[str, float], histograms: dict[str, _HistogramBuilder]
) -> None:
    for attribute, metric in _GAUGES.items():
        setattr(metrics, attribute, _first(scalars, metric.names))
    for attribute, metric in _COUNTERS.items():
        names = [n for name in metric.names for n in (name + "_total", name)]
        setattr(metrics, attribute, _first(scalars, names))
    for attribute, metric in _HISTOGRAMS.items():
        builder = next((histograms[n] for n in metric.names if n in histograms), None)
        if builder is not None and not builder.bad:
            setattr(metrics, attribute, builder.build())


def _first(values: dict[str, float], names: Sequence[str]) -> float | None:
    return next((values[n] for n in names if n in values), None)


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def merge_histograms(histograms: Sequence[Histogram | None]) -> Histogram | None:
    """The histograms present (None skipped) merged into one; None when there is none."""
    found = [h for h in histograms if h is not None]
    if not found:
        return None
    out = found[0]
    for other in found[1:]:
        out = out.merged(other)
    return out
