"""Background loops per instance: vLLM ``/metrics`` scrapes and ``/health`` probes.

Scrape (every ``router.scrape_interval_s``), read by ``engine_interface.parse_metrics``
(names, older-vLLM fallbacks and the aggregation over an instance's engines live there):
running and waiting requests, KV usage, the prefix-cache counters (hit ratio over the
last interval), ``vllm:cache_config_info`` (``num_gpu_blocks`` → KV index capacity) and,
when the engine has a global KV tier, the tokens and bytes it loaded from it (engines
without one export none, so the live view shows tier traffic only for clusters with a tier),
and, when it has a KV connector (disaggregation), its KV reads in flight, failed and the
bytes it read per second; and the inter-token latency histogram's sum and count (flow
control's step time, from their deltas between scrapes).
The served model names come from ``GET /v1/models`` until known.

Probe (every ``router.health_interval_s``): ``GET /health``; 200 is good, anything else
(including no answer within ``router.health_timeout_s``) feeds the circuit breaker; a
probe the router could not even send for want of its own file descriptors or ports is
skipped, not counted against the engine. Each instance is probed on its own schedule, so
one hung instance never delays the probes of the others; with the defaults (0.5 s
interval and timeout, 3 failures) a hung instance is marked down within about 1.5 s.
"""

from __future__ import annotations

import asyncio
import logging
import time

import httpx

from engine_interface import ScrapedMetrics, parse_metrics
from router_worker.core import RouterCore
from router_worker.upstream import is_local_exhaustion

log = logging.getLogger("router_worker.monitor")


class Monitor:
    """Runs the scrape and probe loops for whatever instances the current config has."""

    def __init__(self, core: RouterCore, client: httpx.AsyncClient) -> None:
        self.core = core
        self.client = client

    async def run_scrapes(self) -> None:
        while True:
            runtime = self.core.runtime
            interval = runtime.config.router.scrape_interval_s if runtime else 1.0
            if runtime is not None:
                await asyncio.gather(
                    *(self.scrape(name, url) for name, url in runtime.urls.items())
                )
                self.core.grey_tick()
            await asyncio.sleep(interval)

    async def run_probes(self) -> None:
        probing: dict[str, asyncio.Task] = {}
        try:
            while True:
                runtime = self.core.runtime
                interval = runtime.config.router.health_interval_s if runtime else 1.0
                if runtime is not None:
                    timeout = runtime.config.router.health_timeout_s
                    for name, url in runtime.urls.items():
                        if name not in probing or probing[name].done():
                            probing[name] = asyncio.create_task(self.probe(name, url, timeout))
                await asyncio.sleep(interval)
        finally:
            for task in probing.values():
                task.cancel()

    async def scrape(self, name: str, url: str) -> None:
        try:
            response = await self.client.get(url + "/metrics", timeout=2.0)
            response.raise_for_status()
            parsed = parse_metrics(response.text, histograms=False)
            if parsed.skipped:
                log.debug("scrape %s: %d unreadable lines skipped", name, parsed.skipped)
            info = self.core.scrape.get(name)
            if info is not None and not info.models:
                models = await self.client.get(url + "/v1/models", timeout=2.0)
                cards = models.json().get("data", [])
                info.models = tuple(m["id"] for m in cards)
                lengths = [
                    m["max_model_len"] for m in cards if isinstance(m.get("max_model_len"), int)
                ]
                info.max_model_len = min(lengths) if lengths else None
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as error:
            log.debug("scrape %s failed: %r", name, error)
            return
        self.apply(name, parsed)

    def apply(self, name: str, parsed: ScrapedMetrics) -> None:
        core = self.core
        state = core.state
        if state is None or name not in state.ids:
            return
        capacity = parsed.num_gpu_blocks
        if capacity and parsed.block_size and parsed.block_size != state.block_size:
            capacity = capacity * parsed.block_size // state.block_size
        state.on_scrape(
            name,
            time.time(),
            running=parsed.running,
            waiting=parsed.waiting,
            kv_usage=parsed.kv_usage,
            capacity_blocks=capacity,
            itl_totals=parsed.itl_totals,
        )
        info = core.scrape[name]
        if parsed.prefix_queries is not None and parsed.prefix_hits is not None:
            if info.queries is not None and parsed.prefix_queries > info.queries:
                hits = parsed.prefix_hits - (info.hits or 0.0)
                queries = parsed.prefix_queries - info.queries
                info.hit_ratio = hits / queries
                core.hit_audit.engine_counted(name, hits, queries)
            info.queries, info.hits = parsed.prefix_queries, parsed.prefix_hits
        info.preemptions = parsed.preemptions
        info.tier_hit_tokens = parsed.tier_hit_tokens
        info.tier_bytes_read = parsed.tier_bytes_read
        info.kv_transfers_in_flight = parsed.kv_transfers_in_flight
        info.kv_failed_transfers = parsed.kv_failed_transfers
        info.saw_kv_bytes(time.monotonic(), parsed.kv_bytes_transferred)

    async def probe(self, name: str, url: str, timeout: float) -> None:
        health = self.core.health
        now = time.monotonic()
        if name not in health.instances or not health.due_for_probe(name, now):
            return
        try:
            response = await self.client.get(url + "/health", timeout=timeout)
            ok = response.status_code == 200
            cause = "probe" if ok else f"probe HTTP {response.status_code}"
        except httpx.HTTPError as error:
            if is_local_exhaustion(error):  # the router's own trouble says nothing of the engine
                self.core.metrics.limit_hit("fd_exhausted")
                log.warning("probe of %s skipped: %s", name, error)
                return
            ok, cause = False, f"probe {type(error).__name__}"
        health.record_probe(name, ok, time.monotonic(), cause)
