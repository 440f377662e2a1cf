"""/metrics parsed with prometheus_client, checked against the requests sent (instance 1)."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from enginesim.engine.config import EngineConfig
from enginesim.server.metrics import TTFT_BUCKETS

MODEL = "Qwen/Qwen2-7B-Instruct"
INSTANCE = 1


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(url + "/metrics").text
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples, name: str, **labels: str) -> float:
    key_labels = {"model_name": MODEL, "engine": "0", **labels}
    return samples.get((name, tuple(sorted(key_labels.items()))), 0.0)


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

    assert delta("vllm:request_success_total", finished_reason="length") == 3
    assert delta("vllm:generation_tokens_total") == 17
    assert delta("vllm:prompt_tokens_total") == 300
    assert delta("vllm:prefix_cache_queries_total") == 300
    cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    assert cached == 2 * 96
    assert delta("vllm:prefix_cache_hits_total") == cached
    assert delta("vllm:time_to_first_token_seconds_count") == 3
    assert delta("vllm:inter_token_latency_seconds_count") == 17 - 3
    assert delta("vllm:e2e_request_latency_seconds_count") == 3
    assert delta("vllm:request_prompt_tokens_sum") == 300
    assert delta("vllm:request_generation_tokens_sum") == 17
    inf_bucket = delta("vllm:time_to_first_token_seconds_bucket", le="+Inf")
    assert inf_bucket == 3
    assert value(after, "vllm:num_requests_running") == 0
    assert value(after, "vllm:num_requests_waiting") == 0


def test_vllm_bucket_layout_and_cache_config_info(sim):
    samples = scrape(sim.url(INSTANCE))
    ttft_les = sorted(
        float(dict(labels)["le"])
        for (name, labels) in samples
        if name == "vllm:time_to_first_token_seconds_bucket"
    )
    assert ttft_les == [*TTFT_BUCKETS, float("inf")]
    config = EngineConfig.for_hardware("h20", "qwen2-7b")
    info = [dict(labels) for (name, labels) in samples if name == "vllm:cache_config_info"]
    assert len(info) == 1
    assert info[0]["block_size"] == str(config.block_size)
    assert info[0]["num_gpu_blocks"] == str(config.num_gpu_blocks)
    assert info[0]["engine"] == "0"
    assert 0.0 <= value(samples, "vllm:kv_cache_usage_perc") <= 1.0


def test_a_shared_tier_serves_a_peer_instance_and_is_exported(sim, sim_factory):
    server = sim_factory("--global-tier-blocks", "10000", instances=2, kv_events=False)
    prompt = list(range(5000, 5100))  # 6 full blocks
    for index in (0, 1):  # instance 1 has none of it locally: it loads from the tier
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 2}
        usage = httpx.post(server.url(index) + "/v1/completions", json=body).json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == 96
    first, second = scrape(server.url(0)), scrape(server.url(1))
    assert value(first, "vllm:external_prefix_cache_hits_total") == 0
    assert value(first, "vllm:external_prefix_cache_queries_total") == 100
    assert value(second, "vllm:external_prefix_cache_hits_total") == 96
    kv_bytes = EngineConfig.for_hardware("h20", "qwen2-7b").model.kv_bytes_per_token()
    assert value(second, "enginesim:kv_tier_read_bytes_total") == 96 * kv_bytes
    assert value(second, "enginesim:kv_tier_read_seconds_total") > 0
    assert value(second, "enginesim:kv_tier_read_wait_seconds_total") == 0
    # without a tier (the shared server), no external counters, as vLLM without a connector
    plain = httpx.get(sim.url(INSTANCE) + "/metrics").text
    assert "external_prefix_cache" not in plain and "kv_tier" not in plain
