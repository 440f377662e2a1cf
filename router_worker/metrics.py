"""Prometheus ``/metrics`` of the router process itself (its own registry)."""

from __future__ import annotations

import asyncio
import gc
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.metrics import MetricWrapperBase

from router_worker.routing.saturation import Saturation
from router_worker.stages import StageTimes

FAST_BUCKETS = (
    1e-6,
    2.5e-6,
    5e-6,
    1e-5,
    2.5e-5,
    5e-5,
    1e-4,
    2.5e-4,
    5e-4,
    1e-3,
    2.5e-3,
    5e-3,
    1e-2,
    2.5e-2,
    0.1,
)
LAG_INTERVAL_S = 0.01
OVERHEAD_BUCKETS = (
    5e-5,
    1e-4,
    2.5e-4,
    5e-4,
    7.5e-4,
    1e-3,
    2e-3,
    3e-3,
    5e-3,
    7.5e-3,
    1e-2,
    2.5e-2,
    5e-2,
    0.1,
    0.25,
    1.0,
)
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
TPOT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
)


class LoopHistogram:
    """A histogram family observed from the event loop's thread only (scrapes run there
    too): ``observe`` is a bisect and two list updates, where ``prometheus_client``'s takes
    two locks and walks the buckets, on every request of the hot path.
    ``labels(...)`` returns the series (itself a LoopHistogram), as prometheus_client's does.
    Exposed as a Prometheus histogram (``_bucket``, ``_count``, ``_sum``)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        buckets: Sequence[float],
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.name, self.documentation = name, documentation
        self.labelnames = tuple(labelnames)
        self.bounds = tuple(buckets)
        self.counts = [0] * (len(self.bounds) + 1)  # the last: above every bound
        self.sum = 0.0
        self.series: dict[tuple[str, ...], LoopHistogram] = {}
        if registry is not None:
            registry.register(self)

    def labels(self, *values: str) -> LoopHistogram:
        found = self.series.get(values)
        if found is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name}: labels {self.labelnames}, got {values}")
            found = self.series[values] = LoopHistogram(
                self.name, self.documentation, buckets=self.bounds
            )
        return found

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        series = self.series.items() if self.labelnames else [((), self)]
        bounds = [*(repr(float(b)) for b in self.bounds), "+Inf"]
        for values, histogram in series:
            cumulative, buckets = 0, []
            for bound, count in zip(bounds, histogram.counts, strict=True):
                cumulative += count
                buckets.append((bound, cumulative))
            family.add_metric(list(values), buckets, histogram.sum)
        yield family


Family = TypeVar("Family", bound=MetricWrapperBase | LoopHistogram)


class RouterMetrics:
    """The router's metric families; label children are cached (the hot path is µs-scale)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.requests = Counter(
            "switchyard_router_requests",
            "Requests answered.",
            ["policy", "arm", "reason", "status"],
            registry=r,
        )
        self.tokenize_seconds = LoopHistogram(
            "switchyard_router_tokenize_seconds",
            "Time to tokenize a prompt.",
            ["tier"],
            buckets=FAST_BUCKETS,
            registry=r,
        )
        self.hashing_seconds = LoopHistogram(
            "switchyard_router_hashing_seconds",
            "Time to hash a prompt's blocks.",
            buckets=FAST_BUCKETS,
            registry=r,
        )
        self.decision_seconds = LoopHistogram(
            "switchyard_router_decision_seconds",
            "Time of the policy decision.",
            ["policy"],
            buckets=FAST_BUCKETS,
            registry=r,
        )
        self.retries = Counter(
            "switchyard_router_retries",
            "Requests retried on another instance.",
            ["instance"],
            registry=r,
        )
        self.disaggregated = Counter(
            "switchyard_router_disaggregated_requests",
            "Requests of a disaggregated cluster by the stage that answered them: decode "
            "(split: prefilled on one instance, decoded on another), whole (colocated by the "
            "decider), fallback (colocated after the split failed), prefill (none answered).",
            ["arm", "stage"],
            registry=r,
        )
        self.continuations = Counter(
            "switchyard_router_continuations",
            "Streamed answers broken after their first byte, continued on this instance.",
            ["instance"],
            registry=r,
        )
        self.migrations = Counter(
            "switchyard_router_migrations",
            "Queued requests (no first byte yet) the policy moved to another instance.",
            ["source", "target"],
            registry=r,
        )
        self.upstream_errors = Counter(
            "switchyard_router_upstream_errors",
            "Upstream failures.",
            ["instance", "kind"],
            registry=r,
        )
        self.overhead = LoopHistogram(
            "switchyard_router_overhead_seconds",
            "Router time in a streamed request's first chunk, from the handler's start: to the "
            "upstream request (body, parse, tokenize, hash, decide, failed attempts), plus the "
            "first chunk's relay from the engine to the client.",
            buckets=OVERHEAD_BUCKETS,
            registry=r,
        )
        self.loop_lag = LoopHistogram(
            "switchyard_router_loop_lag_seconds",
            "How late the event loop runs a timer (sampled every 10 ms): what a socket that "
            "becomes readable waits before the router reads it.",
            buckets=OVERHEAD_BUCKETS,
            registry=r,
        )
        self.gc_pause = LoopHistogram(
            "switchyard_router_gc_pause_seconds",
            "How long each collection of Python's cyclic GC held the event loop, by "
            "generation. A request's objects are freed by reference counting, so "
            "collections are rare; frequent or long ones point at something that leaves "
            "reference cycles behind.",
            ["generation"],
            buckets=OVERHEAD_BUCKETS,
            registry=r,
        )
        for generation in ("0", "1", "2"):
            self.gc_pause.labels(generation)
        self.ttft = LoopHistogram(
            "switchyard_router_ttft_seconds",
            "TTFT measured at the router.",
            ["arm"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.tpot = LoopHistogram(
            "switchyard_router_tpot_seconds",
            "TPOT measured at the router.",
            ["arm"],
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        # the label keeps its first name, tier: it is part of the exposition
        # Flow control (router_worker/flow_gate.py), per tenant and class.
        self.flow_requests = Counter(
            "switchyard_router_flow_requests_total",
            "Requests at flow control by tenant, class and outcome: admitted (at once), "
            "queued, released (after waiting), cancelled (the client left while waiting), "
            "or the refusal's reason (shed, evicted, queue_timeout, queue_full: 503; "
            "quota, tenant_queue_full: 429).",
            ["tenant", "class", "outcome"],
            registry=r,
        )
        self.flow_queued = Gauge(
            "switchyard_router_flow_queued",
            "Requests waiting at flow control by tenant and class.",
            ["tenant", "class"],
            registry=r,
        )
        self.flow_saturated = Gauge(
            "switchyard_router_flow_saturated",
            "1 while the saturation detector finds the fleet saturated.",
            registry=r,
        )
        self.flow_backlog_bound = Gauge(
            "switchyard_router_flow_backlog_bound_seconds",
            "The prefill backlog flow control admits up to: flow.max_backlog_s, or with "
            "flow.tpot_slo_s the bound the TPOT leg adapts.",
            registry=r,
        )
        self.flow_step = Gauge(
            "switchyard_router_flow_step_seconds",
            "The step time the engines ran at over the last scrape interval (their mean "
            "inter-token latency, token-weighted over the healthy instances; NaN: none).",
            registry=r,
        )
        self.tenant_ttft = LoopHistogram(
            "switchyard_router_tenant_ttft_seconds",
            "TTFT measured at the router (time waiting at flow control included), by "
            "tenant and class.",
            ["tenant", "class"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.tenant_tpot = LoopHistogram(
            "switchyard_router_tenant_tpot_seconds",
            "TPOT measured at the router by tenant and class.",
            ["tenant", "class"],
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        self.tokenizations = Counter(
            "switchyard_router_tokenization", "Requests by tokenization mode.", ["tier"], registry=r
        )
        self.in_flight = Gauge("switchyard_router_in_flight", "Requests in flight.", registry=r)
        # A plain int read at scrape time: Gauge.inc/dec take a lock twice per request.
        self.in_flight_count = 0
        self.in_flight.set_function(lambda: self.in_flight_count)
        self.rejected = Counter(
            "switchyard_router_rejected", "Requests refused before routing.", ["status"], registry=r
        )
        self.limit_hits = Counter(
            "switchyard_router_limit_hits",
            "Resource limits hit: header_timeout, intake_queue, "
            "body_timeout, connections, response_deadline, response_too_large, "
            "response_headers_too_large, event_too_large, bad_response (wrong content type "
            "or malformed body/SSE), fd_exhausted (the router out of file descriptors or "
            "local ports; never counted against an engine).",
            ["limit"],
            registry=r,
        )
        # The silent-fallback alarm (router_worker/hit_audit.py).
        self.predicted_hit_tokens = Counter(
            "switchyard_router_predicted_hit_tokens",
            "Prompt tokens the router predicted cached on the instance it chose, for the "
            "requests served there (router token units; compare ratios with the engine's "
            "vllm:prefix_cache_hits / queries).",
            ["instance"],
            registry=r,
        )
        self.predicted_prompt_tokens = Counter(
            "switchyard_router_predicted_prompt_tokens",
            "Prompt tokens of those requests (router token units).",
            ["instance"],
            registry=r,
        )
        self.predicted_hit_ratio = Gauge(
            "switchyard_router_predicted_hit_ratio",
            "The router's predicted prefix-hit ratio on the instance over its last judged window.",
            ["instance"],
            registry=r,
        )
        self.confirmed_hit_ratio = Gauge(
            "switchyard_router_confirmed_hit_ratio",
            "The engine's own prefix-hit ratio (its prefix_cache counters) over that window.",
            ["instance"],
            registry=r,
        )
        self.silent_fallback = Gauge(
            "switchyard_router_silent_fallback",
            "1 while the router predicts prefix hits on the instance that its engine's own "
            "counters do not confirm (predicted hit ratio >= 0.2 and at least 0.25 above the "
            "engine's: the router's tokenizer or chat template differs from the engine's, and "
            "KV-aware routing has silently fallen back to load balancing), else 0.",
            ["instance"],
            registry=r,
        )
        self.intake_queued = Gauge(
            "switchyard_router_intake_queued",
            "Request bodies waiting for an intake worker process or in one.",
            registry=r,
        )
        self.intake_queued_bytes = Gauge(
            "switchyard_router_intake_queued_bytes",
            "Total size of the request bodies waiting for an intake worker process or in one.",
            registry=r,
        )
        self.intake_dropped = Counter(
            "switchyard_router_intake_dropped",
            "Request bodies dropped unparsed from the intake queue: their client went away.",
            registry=r,
        )
        self.bodies_unread = Counter(
            "switchyard_router_bodies_unread",
            "Requests whose client went away before the router had read their whole body: "
            "nothing of them was parsed or routed.",
            registry=r,
        )
        self.intake_abandoned = Counter(
            "switchyard_router_intake_abandoned",
            "Request bodies whose client went away while an intake worker process was taking "
            "them in: the worker finishes, its result is discarded.",
            registry=r,
        )
        self.connections = Gauge(
            "switchyard_router_connections", "Open client connections.", registry=r
        )
        self.telemetry_dropped = Counter(
            "switchyard_router_telemetry_dropped",
            "Events dropped while Redis was unreachable.",
            registry=r,
        )
        self.kv_events_malformed = Counter(
            "switchyard_router_kv_events_malformed",
            "Malformed KV-event messages skipped, by instance and reason (frames, sequence, "
            "decode, apply).",
            ["instance", "reason"],
            registry=r,
        )
        self.kv_subscriber_crashes = Counter(
            "switchyard_router_kv_subscriber_crashes",
            "KV-event subscriber tasks that stopped on an error and were restarted.",
            ["instance"],
            registry=r,
        )
        self.peer_sent = Counter(
            "switchyard_router_peer_sent",
            "Replica-sync messages published, by kind.",
            ["kind"],
            registry=r,
        )
        self.peer_applied = Counter(
            "switchyard_router_peer_applied",
            "Peer routers' messages applied to the indicators, by kind.",
            ["kind"],
            registry=r,
        )
        self.peer_skipped = Counter(
            "switchyard_router_peer_skipped",
            "Valid peer messages not applied: unknown_instance, block_size, duplicate, unknown_id.",
            ["reason"],
            registry=r,
        )
        self.peer_dropped = Counter(
            "switchyard_router_peer_dropped",
            "Replica-sync messages or records dropped: queue_full and publish_failed (ours, "
            "not sent); peer_timeout, peer_restarted, max_age, redis_down, disabled (peer "
            "requests removed from the indicators).",
            ["reason"],
            registry=r,
        )
        self.peer_malformed = Counter(
            "switchyard_router_peer_malformed",
            "Malformed peer messages skipped, by reason.",
            ["reason"],
            registry=r,
        )
        self.peer_task_restarts = Counter(
            "switchyard_router_peer_task_restarts",
            "Replica-sync tasks that stopped on an error and were restarted.",
            ["task"],
            registry=r,
        )
        self.peers = Gauge(
            "switchyard_router_peers", "Peer routers heard from recently.", registry=r
        )
        self.grey_level = Gauge(
            "switchyard_router_instance_grey_level",
            "Grey-failure state: 0 healthy, 1 suspect, 2 degraded, 3 drained.",
            ["instance"],
            registry=r,
        )
        self.grey_excess = Gauge(
            "switchyard_router_instance_grey_excess",
            "How much slower than its own normal, beyond the fleet's drift (1 = none).",
            ["instance"],
            registry=r,
        )
        self.config_version = Gauge(
            "switchyard_router_config_version", "Applied configuration version.", registry=r
        )
        # The autoscaling signal (router_worker/routing/saturation.py), read at scrape time
        # from the source the router core sets (`watch_saturation`)
        self.saturation_source: Callable[[], Saturation] = lambda: Saturation(0, 0.0, 0.0)
        for name, doc, read in (
            (
                "switchyard_router_fleet_pending_prefill_seconds",
                "Seconds of queued prefill work per healthy instance, on average (pending "
                "prefill tokens / the instance's prefill throughput): the autoscaling signal.",
                lambda: self.saturation_source().pending_prefill_s,
            ),
            (
                "switchyard_router_fleet_kv_pressure",
                "Mean KV cache usage (0-1) the healthy instances report: the autoscaling "
                "signal's second half.",
                lambda: self.saturation_source().kv_pressure,
            ),
            (
                "switchyard_router_fleet_instances",
                "Healthy instances the router routes to.",
                lambda: float(self.saturation_source().instances),
            ),
        ):
            Gauge(name, doc, registry=r).set_function(read)
        self.stages = StageTimes()
        r.register(self.stages)
        self._children: dict[tuple[object, ...], MetricWrapperBase] = {}

    def watch_gc(self) -> Callable[[], None]:
        """Time every cyclic-GC collection into ``gc_pause`` from now on; returns the call
        that stops it (``gc.callbacks`` is the process's, not this registry's)."""
        started = 0.0

        def timed(phase: str, info: dict[str, int]) -> None:
            nonlocal started
            if phase == "start":
                started = time.perf_counter()
            else:
                pause = time.perf_counter() - started
                self.gc_pause.labels(str(info["generation"])).observe(pause)

        gc.callbacks.append(timed)
        return lambda: gc.callbacks.remove(timed)

    async def sample_loop_lag(self, interval: float = LAG_INTERVAL_S) -> None:
        """Forever: sleep ``interval`` and record how much later than asked we woke."""
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + interval
            await asyncio.sleep(interval)
            self.loop_lag.observe(max(loop.time() - due, 0.0))

    def child(self, family: Family, *labels: str) -> Family:
        if isinstance(family, LoopHistogram):
            return cast(Family, family.labels(*labels))  # a dict lookup already
        key = (id(family), *labels)
        found = self._children.get(key)
        if found is None:
            found = family.labels(*labels)
            self._children[key] = found
        return cast(Family, found)  # the key holds id(family): a child of the same class

    def limit_hit(self, limit: str) -> None:
        self.child(self.limit_hits, limit).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
