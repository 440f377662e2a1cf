"""/metrics parsed with prometheus_client, checked against the requests sent (instance 1)."""

from __future__ import annotations

import httpx
import pytest

import engine_interface as ei
from engine_interface import parse_metrics
from enginesim.engine.config import EngineConfig
from enginesim.server.metrics import TTFT_BUCKETS
from tests.enginesim.helpers import MODEL, scrape, value

INSTANCE = 1


def test_counters_and_histograms_follow_the_requests(sim):
    url = sim.url(INSTANCE)
    before = scrape(url)
    prompt = list(range(1000, 1100))  # 100 tokens: 6 full blocks
    usages = []
    for max_tokens in (7, 7, 3):  # the second and third reuse the first's blocks
        body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens}
        usages.append(httpx.post(url + "/v1/completions", json=body).json()["usage"])
    after = scrape(url)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta(ei.REQUEST_SUCCESS.total, finished_reason="length") == 3
    assert delta(ei.GENERATION_TOKENS.total) == 17
    assert delta(ei.PROMPT_TOKENS.total) == 300
    assert delta(ei.PREFIX_QUERIES.total) == 300
    cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    assert cached == 2 * 96
    assert delta(ei.PREFIX_HITS.total) == cached
    assert delta(ei.TTFT.name + "_count") == 3
    assert delta(ei.ITL.name + "_count") == 17 - 3
    assert delta(ei.E2E_LATENCY.name + "_count") == 3
    assert delta(ei.REQUEST_PROMPT_TOKENS.name + "_sum") == 300
    assert delta(ei.REQUEST_GENERATION_TOKENS.name + "_sum") == 17
    inf_bucket = delta(ei.TTFT.name + "_bucket", le="+Inf")
    assert inf_bucket == 3
    assert value(after, ei.RUNNING.name) == 0
    assert value(after, ei.WAITING.name) == 0


def test_vllm_bucket_layout_and_cache_config_info(sim):
    samples = scrape(sim.url(INSTANCE))
    bucket = ei.TTFT.name + "_bucket"
    ttft_les = sorted(float(s.labels["le"]) for s in samples if s.name == bucket)
    assert ttft_les == [*TTFT_BUCKETS, float("inf")]
    config = EngineConfig.for_hardware("h20", "qwen2-7b")
    info = [s.labels for s in samples if s.name == ei.CACHE_CONFIG_INFO.name]
    assert len(info) == 1
    assert info[0]["block_size"] == str(config.block_size)
    assert info[0]["num_gpu_blocks"] == str(config.num_gpu_blocks)
    assert info[0]["engine"] == "0"
    assert 0.0 <= value(samples, ei.KV_USAGE.name) <= 1.0


def test_a_shared_tier_serves_a_peer_instance_and_is_exported(sim, sim_factory):
    server = sim_factory("--global-tier-blocks", "10000", instances=2, kv_events=False)
    prompt = list(range(5000, 5100))  # 6 full blocks
    for index in (0, 1):  # instance 1 has none of it locally: it loads from the tier
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 2}
        usage = httpx.post(server.url(index) + "/v1/completions", json=body).json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == 96
    first, second = scrape(server.url(0)), scrape(server.url(1))
    assert value(first, ei.EXTERNAL_PREFIX_HITS.total) == 0
    assert value(first, ei.EXTERNAL_PREFIX_QUERIES.total) == 100
    assert value(second, ei.EXTERNAL_PREFIX_HITS.total) == 96
    kv_bytes = EngineConfig.for_hardware("h20", "qwen2-7b").model.kv_bytes_per_token()
    assert value(second, ei.TIER_READ_BYTES.total) == 96 * kv_bytes
    assert value(second, ei.TIER_READ_SECONDS.total) > 0
    assert value(second, ei.TIER_READ_WAIT_SECONDS.total) == 0
    parsed = parse_metrics(httpx.get(server.url(1) + "/metrics").text)
    assert (parsed.tier_hit_tokens, parsed.tier_bytes_read) == (96, 96 * kv_bytes)
    # without a tier (the shared server), no external counters, as vLLM without a connector
    plain = httpx.get(sim.url(INSTANCE) + "/metrics").text
    assert "external_prefix_cache" not in plain and "kv_tier" not in plain


def test_the_router_reads_every_metric_it_uses_from_the_simulator(sim):
    """enginesim exposes the names engine_interface reads (no fallback)."""
    url = sim.url(INSTANCE)
    body = {"model": MODEL, "prompt": list(range(2000, 2040)), "max_tokens": 4}
    httpx.post(url + "/v1/completions", json=body).raise_for_status()
    parsed = parse_metrics(httpx.get(url + "/metrics").text)
    config = EngineConfig.for_hardware("h20", "qwen2-7b")
    assert parsed.skipped == 0 and list(parsed.engines) == ["0"]
    assert (parsed.running, parsed.waiting) == (0.0, 0.0)
    assert parsed.kv_usage is not None and 0.0 <= parsed.kv_usage <= 1.0
    assert parsed.prefix_queries is not None and parsed.prefix_queries >= 40
    assert parsed.prefix_hits is not None
    assert (parsed.num_gpu_blocks, parsed.block_size) == (config.num_gpu_blocks, config.block_size)
    ttft, itl, e2e = parsed.histogram("ttft"), parsed.histogram("itl"), parsed.histogram("e2e")
    assert ttft is not None and itl is not None and e2e is not None
    assert ttft.count >= 1 and ttft.buckets[-1] == (float("inf"), ttft.count)
    assert itl.count >= 3 and e2e.count >= 1


def test_gpu_memory_utilization_sets_the_kv_capacity_it_reports(tmp_path):
    """vLLM's option: a smaller share of the GPU leaves fewer KV blocks, and /metrics says
    how many (the control plane replays the cluster on that many)."""
    from devharness import Fleet

    expected = EngineConfig.for_hardware("h20", "qwen2-7b", gpu_memory_utilization=0.5)
    extra = ["--gpu-memory-utilization", "0.5"]
    with Fleet(1, extra=extra, log=tmp_path / "sim.log") as fleet:
        parsed = parse_metrics(httpx.get(fleet.url(0) + "/metrics").text)
    assert parsed.num_gpu_blocks == expected.num_gpu_blocks
    assert parsed.summary()["engine_kv_blocks"] == expected.num_gpu_blocks


def test_the_routers_scrape_reads_the_step_time_the_engine_ran_at(sim):
    # Flow control's TPOT leg: the router's scrape (no histograms) reads ITL's sum and
    # count from enginesim's /metrics, the monitor feeds them to on_scrape, and the fleet
    # load carries the mean inter-token latency of the tokens between two scrapes.
    from types import SimpleNamespace

    from router_worker.core import ScrapeInfo
    from router_worker.hit_audit import HitAudit
    from router_worker.metrics import RouterMetrics
    from router_worker.monitor import Monitor
    from router_worker.routing import ClusterState
    from router_worker.routing.flow import FleetLoad

    url = sim.url(INSTANCE)
    state = ClusterState()
    state.add_instance("i")
    core = SimpleNamespace(
        state=state, scrape={"i": ScrapeInfo()}, hit_audit=HitAudit(RouterMetrics())
    )
    monitor = Monitor(core, None)  # type: ignore[arg-type]  # apply() reads only these
    before = httpx.get(url + "/metrics").text
    monitor.apply("i", parse_metrics(before, histograms=False))
    body = {"model": MODEL, "prompt": list(range(2000, 2100)), "max_tokens": 20}
    httpx.post(url + "/v1/completions", json=body)
    after = httpx.get(url + "/metrics").text
    monitor.apply("i", parse_metrics(after, histograms=False))
    now, then = parse_metrics(after).histogram("itl"), parse_metrics(before).histogram("itl")
    assert now is not None and then is not None
    itl = now.since(then)
    assert itl.count == 19
    assert FleetLoad.of(state).step_s == pytest.approx(itl.sum / itl.count)
    assert 0 < FleetLoad.of(state).step_s < 1
