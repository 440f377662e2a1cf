"""What the tests of enginesim's HTTP server share: a scrape of an instance's /metrics and
the value of one of its series."""

from __future__ import annotations

import httpx
from prometheus_client.samples import Sample

from engine_interface import read_samples, sample_total

MODEL = "Qwen/Qwen2-7B-Instruct"


def scrape(url: str) -> list[Sample]:
    samples, skipped = read_samples(httpx.get(url + "/metrics").text)
    assert skipped == 0
    return samples


def value(samples: list[Sample], name: str, **labels: str) -> float:
    return sample_total(samples, name, model_name=MODEL, engine="0", **labels)
