"""The control plane's instance scrape reads /metrics as the routers do (engine_interface)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from controlplane.services import clusters, instance_health
from devharness import Fleet
from tests.fleets import fast_fleet
from tests.foundation.helpers import CURRENT, OLDER

from .helpers import SYSTEM


@pytest.fixture(scope="module")
def engine() -> Iterator[Fleet]:
    with fast_fleet(1) as fleet:
        yield fleet


def _cluster_on(url: str):
    cluster = clusters.create_cluster(SYSTEM, name="scraped", model="Qwen/Qwen2-7B", gpu_type="h20")
    clusters.add_instance(SYSTEM, cluster.pk, name="i0", url=url, reason="setup")
    return cluster


def test_a_live_engine_is_scraped_into_last_scrape(db, engine):
    body = {"model": "Qwen/Qwen2-7B-Instruct", "prompt": list(range(3000, 3064)), "max_tokens": 2}
    httpx.post(engine.url(0) + "/v1/completions", json=body, timeout=10).raise_for_status()
    cluster = _cluster_on(engine.url(0))
    assert instance_health.scrape_cluster(cluster) == {"i0": True}
    scraped = cluster.instances.get().last_scrape
    assert scraped["running"] == 0.0 and scraped["waiting"] == 0.0
    assert 0.0 <= scraped["kv_usage"] <= 1.0
    assert scraped["prefix_queries"] >= 64 and "prefix_hits" in scraped


def _vllm(text: str) -> httpx.Client:
    """A vLLM server enginesim cannot be (two data-parallel engines, or an older release)."""

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=text if request.url.path == "/metrics" else "")

    return httpx.Client(transport=httpx.MockTransport(answer))


def test_kv_usage_is_the_mean_over_engines_as_the_router_reads_it(db):
    instance = _cluster_on("http://vllm:8000").instances.get()
    healthy, scraped = instance_health.scrape_instance(_vllm(CURRENT), instance)
    assert healthy
    assert scraped == {
        "running": 5.0,
        "waiting": 1.0,
        "kv_usage": 0.5,
        "prefix_queries": 150.0,
        "prefix_hits": 50.0,
        "engine_kv_blocks": 81541,
    }


def test_an_older_vllm_is_read_by_its_older_names(db):
    instance = _cluster_on("http://vllm:8000").instances.get()
    _, scraped = instance_health.scrape_instance(_vllm(OLDER), instance)
    assert scraped == {
        "running": 4.0,
        "kv_usage": 0.5,
        "prefix_queries": 200.0,
        "prefix_hits": 120.0,
    }
