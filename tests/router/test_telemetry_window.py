"""The router's recent-traffic window (``telemetry._Window``), behind the state snapshot's
per-arm and overall stats: what it reports against the same stats worked out sample by
sample, as requests arrive in batches, age out and overflow the window."""

from __future__ import annotations

import random

import numpy as np
import pytest

from router_worker.telemetry import WINDOW_S, RequestSample, _Window


def sample(rng: random.Random, at: float) -> RequestSample:
    first_token = rng.random() > 0.2
    return RequestSample(
        at=at,
        arm=rng.choice(["baseline", "canary"]),
        policy="lmetric",
        instance="i0",
        ok=rng.random() > 0.1,
        ttft=rng.random() if first_token else None,
        tpot=rng.random() / 50 if first_token else None,
        output_tokens=rng.randint(0, 300),
        prompt_tokens=rng.randint(1, 4000),
        cached_tokens=rng.randint(0, 100),
        fallback=False,
    )


def expected(samples: list[RequestSample], now: float, arm: str | None) -> dict[str, object]:
    """The stats the window should report, one sample at a time."""
    mine = [s for s in samples if s.at >= now - WINDOW_S and arm in (None, s.arm)]
    ttft = [s.ttft for s in mine if s.ttft is not None]
    tpot = [s.tpot for s in mine if s.tpot is not None]
    span = max(min(WINDOW_S, mine[-1].at - mine[0].at), 1.0) if mine else WINDOW_S
    prompt = sum(s.prompt_tokens for s in mine)
    return {
        "requests": len(mine),
        "errors": sum(not s.ok for s in mine),
        "requests_per_s": len(mine) / span,
        "output_tokens_per_s": sum(s.output_tokens for s in mine) / span,
        "ttft_p50_s": float(np.percentile(ttft, 50)) if ttft else None,
        "ttft_p99_s": float(np.percentile(ttft, 99)) if ttft else None,
        "tpot_p50_s": float(np.percentile(tpot, 50)) if tpot else None,
        "tpot_p99_s": float(np.percentile(tpot, 99)) if tpot else None,
        "hit_ratio": sum(s.cached_tokens for s in mine) / prompt if prompt else None,
    }


@pytest.mark.parametrize("size", [40, 10_000])
def test_the_window_reports_its_recent_requests_per_arm_and_in_all(size: int) -> None:
    rng = random.Random(size)
    window = _Window(size, batch=7)
    added: list[RequestSample] = []
    now = 1_000.0
    for step in range(30):  # 30 reads of 0-60 new requests, 0-4 s apart
        now += rng.random() * 4
        for k in range(rng.randint(0, 60)):
            added.append(sample(rng, now + k * 1e-3))
            window.add(added[-1])
        held = added[-size:]  # a full window keeps the newest
        for arm in (None, "baseline", "canary", "never-seen"):
            stats = window.stats(now, arm).model_dump(exclude={"seconds", "load_cv"})
            assert stats == pytest.approx(expected(held, now, arm)), (step, arm)


def test_an_empty_window_reports_no_requests_and_no_percentiles() -> None:
    stats = _Window(100).stats(5.0, None)
    assert (stats.requests, stats.errors, stats.requests_per_s) == (0, 0, 0.0)
    assert stats.ttft_p50_s is None and stats.tpot_p99_s is None and stats.hit_ratio is None


def test_a_metrics_record_counts_and_samples_each_arm_and_instance() -> None:
    """The interval behind each metrics record: counters per arm and per instance, and
    their TTFT/TPOT samples (a list only where some request had the value; at most
    MAX_SAMPLES_PER_RECORD, drawn from all of them)."""
    from router_worker.contract import telemetry as contract
    from router_worker.telemetry import _Interval

    rng = random.Random(3)
    interval = _Interval(0.0, random.Random(4))
    samples = [sample(rng, at=float(k)) for k in range(3 * contract.MAX_SAMPLES_PER_RECORD)]
    for k, s in enumerate(samples):
        s.instance = ("i0", "i1", None)[k % 3]
        s.fallback = k % 7 == 0
        interval.add(s)
    # An instance no request with a first token went to gets no TTFT/TPOT lists.
    lone = sample(rng, at=0.0)
    lone.arm, lone.instance, lone.ttft, lone.tpot = "baseline", "i9", None, None
    interval.add(lone)
    samples.append(lone)
    record = interval.record("c", "r", 10.0, {})
    for arm in ("baseline", "canary"):
        mine = [s for s in samples if s.arm == arm]
        got = record.arms[arm]
        assert (got.requests, got.errors) == (len(mine), sum(not s.ok for s in mine))
        assert got.output_tokens == sum(s.output_tokens for s in mine)
        assert got.hotspot_fallbacks == sum(s.fallback for s in mine)
        ttft = {s.ttft for s in mine if s.ttft is not None}
        assert len(got.ttft_s) == min(len(ttft), contract.MAX_SAMPLES_PER_RECORD)
        assert set(got.ttft_s) <= ttft
        assert set(got.tpot_s) <= {s.tpot for s in mine if s.tpot is not None}
    for name in ("i0", "i1"):
        mine = [s for s in samples if s.instance == name]
        instance = record.instances[name]
        assert instance.requests == len(mine)
        assert set(instance.ttft_s) <= {s.ttft for s in mine if s.ttft is not None}
        assert instance.ttft_s and instance.tpot_s
    assert record.instances["i9"].requests == 1
    assert record.instances["i9"].ttft_s == [] and record.instances["i9"].tpot_s == []
    assert "ttft_s" not in record.instances["i9"].model_fields_set
