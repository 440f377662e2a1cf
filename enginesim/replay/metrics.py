"""Per-policy summaries and the trace's TTFT lower bound.

Definitions (docs/architecture.md, glossary): TTFT = first token − arrival; TPOT =
(finish − first token) / (output tokens − 1) over requests with more than one output
token; hit ratio = prompt tokens the engines did not prefill (engine-reported) / prompt
tokens, over completed requests; load CV = the router's load CV (``engine_interface.load_cv``:
stddev / mean across instances) of the true pending prefill tokens, averaged over the
scrape ticks where the mean is positive; busy fraction = engine step
time summed over instances / (instances × makespan); makespan = first arrival → last
finish.

Goodput (DistServe's): requests per second that meet the SLO on TTFT *and* TPOT together
(:class:`Slo`), over the arrival span (first to last arrival), so it is the offered rate
× SLO attainment: a policy that wins TTFT by wrecking decode loses requests to the TPOT
SLO and so loses goodput. SLO attainment counts every request (rejected and failed ones
miss). A summary carries the SLO it was judged by; without one, :data:`DEFAULT_SLO`.

With a global KV tier, ``tier`` holds its traffic over the run: bytes read, hit tokens
(prompt tokens loaded from the tier instead of recomputed, counted per load, so a request
preempted and readmitted counts twice), the step time spent loading and the part of it
spent queued behind other instances' reads (the shared link), their share of the
completed requests' prompt tokens (``hit_ratio``, first loads only), and the same per
instance. Runs without a tier have no ``tier`` key.

Lower bound (:func:`ttft_lower_bound`): each request alone on an idle instance with an
infinite cache that holds every token any *earlier* request prefilled; its TTFT is the
per-request overhead plus the chunked prefill of the rest. No policy can beat it on any
request. The summary counts only
the requests an engine accepts (:func:`servable`), as the policies' TTFTs do: a 100k-token
prompt that every engine refuses would otherwise weigh on the bound alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine_interface import mean_load_cv, percentile
from enginesim.engine import EngineConfig
from enginesim.replay.simulator import RequestResult, SimResult
from enginesim.replay.traces import TraceRecord

SUMMARY_KEYS = (
    "policy",
    "requests",
    "completed",
    "ttft_mean_s",
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_p99_s",
    "tpot_mean_s",
    "tpot_p99_s",
    "throughput_tok_s",
    "slo_attainment",
    "goodput_rps",
    "hit_ratio",
    "load_cv",
    "hotspot_events",
    "busy_fraction",
    "wall_s",
)


@dataclass(frozen=True, slots=True)
class Slo:
    """What a request must meet to count toward goodput: both bounds (seconds)."""

    ttft_s: float
    tpot_s: float


# Interactive chat on long prompts (the Mooncake traces' SLO in bench/replay/run.py), for
# summaries of runs that name none (the replay CLI).
DEFAULT_SLO = Slo(ttft_s=5.0, tpot_s=0.1)


@dataclass(frozen=True, slots=True)
class Goodput:
    """Requests meeting an SLO: how many, their share of all requests, and per second of
    arrivals (None when every request arrived at one instant: there is no rate)."""

    met: int
    attainment: float | None
    rps: float | None


def ttft_of(done: RequestResult) -> float:
    """The time to first token of a completed request."""
    assert done.first_token_s is not None, done.id  # a completed request
    return done.first_token_s - done.arrival_s


def tpot_of(done: RequestResult) -> float:
    """Of a completed request with more than one output token."""
    assert done.first_token_s is not None and done.finish_s is not None, done.id
    return (done.finish_s - done.first_token_s) / (done.output_tokens - 1)


def ttfts(requests: Sequence[RequestResult]) -> np.ndarray:
    return np.array([ttft_of(r) for r in requests if r.status == "ok"])


def _tpots(done: Sequence[RequestResult]) -> np.ndarray:
    return np.array([tpot_of(r) for r in done if r.output_tokens > 1])


def slo_met(done: Sequence[RequestResult], ttft_s: float, tpot_s: float) -> int:
    """Completed requests whose TTFT and TPOT (if they have one) both meet the SLO."""
    return sum(
        ttft_of(r) <= ttft_s and (r.output_tokens <= 1 or tpot_of(r) <= tpot_s) for r in done
    )


def goodput(requests: Sequence[RequestResult], slo: Slo) -> Goodput:
    """SLO attainment and goodput of a run's requests (see the module docstring)."""
    done = [r for r in requests if r.status == "ok"]
    met = slo_met(done, slo.ttft_s, slo.tpot_s)
    arrivals = [r.arrival_s for r in requests]
    span = max(arrivals) - min(arrivals) if arrivals else 0.0
    return Goodput(
        met=met,
        attainment=met / len(requests) if requests else None,
        rps=met / span if span > 0 else None,
    )


def _stat(values: np.ndarray, q: float | None = None) -> float | None:
    """The mean (``q`` None) or the ``q``-th percentile (q in [0, 100]); None if empty."""
    if q is not None:
        return percentile(values, q)
    return float(values.mean()) if len(values) else None


def summarize(result: SimResult, slo: Slo = DEFAULT_SLO) -> dict[str, Any]:
    """The results.json object of one policy run (SUMMARY_KEYS plus a few extras), goodput
    judged by ``slo``."""
    done = [r for r in result.requests if r.status == "ok"]
    good = goodput(result.requests, slo)
    ttft = ttfts(done)
    tpot = _tpots(done)
    start = min((r.arrival_s for r in result.requests), default=0.0)
    end = max((r.finish_s for r in result.requests if r.finish_s is not None), default=start)
    span = max(end - start, 1e-9)
    prompt = sum(r.prompt_tokens for r in done)
    summary = {
        "policy": result.policy,
        "requests": len(result.requests),
        "completed": len(done),
        "ttft_mean_s": _stat(ttft),
        "ttft_p50_s": _stat(ttft, 50),
        "ttft_p90_s": _stat(ttft, 90),
        "ttft_p99_s": _stat(ttft, 99),
        "tpot_mean_s": _stat(tpot),
        "tpot_p99_s": _stat(tpot, 99),
        "throughput_tok_s": sum(r.output_tokens for r in done) / span,
        "slo_attainment": good.attainment,
        "goodput_rps": good.rps,
        "hit_ratio": sum(r.cached_tokens for r in done) / prompt if prompt else None,
        "load_cv": mean_load_cv(result.pending_samples),
        "hotspot_events": result.hotspot_events.get("confirmed", 0),
        "busy_fraction": result.busy_time / (len(result.instance_ids) * span),
        "wall_s": result.wall_s,
    }
    summary.update(
        ttft_p95_s=_stat(ttft, 95),
        tpot_p50_s=_stat(tpot, 50),
        slo_ttft_s=slo.ttft_s,
        slo_tpot_s=slo.tpot_s,
        slo_met=good.met,
        request_throughput_rps=len(done) / span,
        rejected=sum(r.status == "rejected" for r in result.requests),
        failed=sum(r.status == "failed" for r in result.requests),
        makespan_s=span,
        hotspot_transitions=result.hotspot_events,
        decision_reasons=result.decision_reasons,
    )
    if result.tier is not None:
        summary["tier"] = tier_summary(result, done, prompt)
    if result.disaggregation is not None:
        summary["disaggregation"] = result.disaggregation
    return summary


def tier_summary(result: SimResult, done: Sequence[RequestResult], prompt: int) -> dict[str, Any]:
    assert result.tier is not None  # summarize asks only of a cluster with a global tier
    tier_tokens = sum(r.tier_tokens or 0 for r in done)
    return {
        **result.tier.to_json(),
        "hit_ratio": tier_tokens / prompt if prompt else None,
        "per_instance": {k: v.to_json() for k, v in result.tier_by_instance.items()},
    }


# ----------------------------------------------------------------- lower bound


def infinite_cache_hits(records: Sequence[TraceRecord]) -> np.ndarray:
    """Per request, leading prompt tokens already prefilled by some earlier request.

    A trie over block ids (keyed by parent node, so ids need not be globally chained);
    each node remembers how many tokens of its block any request has covered, so a
    partial last block counts for what it holds.
    """
    nodes: dict[tuple[int, int], int] = {}
    covered = [0]  # tokens of the block held, per trie node; node 0 is the root
    hits = np.zeros(len(records), dtype=np.int64)
    for i, record in enumerate(records):
        parent, cached, matching = 0, 0, True
        size = record.block_size
        for j, block_id in enumerate(record.block_ids):
            length = min(size, record.input_tokens - j * size)
            if length <= 0:
                break
            node = nodes.get((parent, block_id))
            if node is None:
                node = nodes[(parent, block_id)] = len(covered)
                covered.append(0)
            if matching:
                cached += min(covered[node], length)
                matching = covered[node] >= length
            covered[node] = max(covered[node], length)
            parent = node
        hits[i] = cached
    return hits


def ttft_lower_bound(
    records: Sequence[TraceRecord], config: EngineConfig, hits: np.ndarray | None = None
) -> np.ndarray:
    """Per request: the per-request overhead plus the chunked prefill time of its tokens no
    earlier request prefilled, alone on an idle engine (the engine's own cost model,
    calibration, chunk and block size).
    ``hits``: ``infinite_cache_hits(records)``, if already known."""
    if hits is None:
        hits = infinite_cache_hits(records)
    model = config.cost_model()
    block = config.block_size
    chunk = config.max_num_batched_tokens
    bounds = np.zeros(len(records))
    memo: dict[tuple[int, int], float] = {}
    for i, record in enumerate(records):
        # The engine reuses whole blocks only, and never the prompt's last token.
        usable = min(int(hits[i]) // block, (record.input_tokens - 1) // block) * block
        key = (record.input_tokens - usable, usable)
        if key not in memo:
            memo[key] = (
                model.prefill_time(key[0], chunk=chunk, context=usable)
                + model.calibration.t_request
            )
        bounds[i] = memo[key]
    return bounds


def servable(records: Sequence[TraceRecord], config: EngineConfig) -> list[TraceRecord]:
    """The records an engine of ``config`` accepts as the simulator sends them (the prompt
    and at least one output token within the context window and the KV cache)."""
    limit = min(config.max_model_len, config.kv_capacity_tokens)
    return [
        r
        for r in records
        if r.input_tokens > 0 and r.input_tokens + max(r.output_tokens, 1) <= limit
    ]


def lower_bound_summary(
    records: Sequence[TraceRecord], config: EngineConfig
) -> tuple[dict[str, Any], np.ndarray]:
    """The lower bound's table row, and the per-request bounds of the servable records."""
    accepted = servable(records, config)
    hits = infinite_cache_hits(accepted)
    bounds = ttft_lower_bound(accepted, config, hits)
    prompt = sum(r.input_tokens for r in accepted)
    return {
        "policy": "lower_bound",
        "requests": len(records),
        "completed": len(accepted),
        "ttft_mean_s": _stat(bounds),
        "ttft_p50_s": _stat(bounds, 50),
        "ttft_p90_s": _stat(bounds, 90),
        "ttft_p99_s": _stat(bounds, 99),
        "hit_ratio": float(hits.sum() / prompt) if prompt else None,
    }, bounds


def by_tenant(requests: Sequence[RequestResult]) -> dict[str, dict[str, Any]]:
    """Per tenant (flow control): how its requests ended, its p90 TTFT (time queued
    included) and the mean time its served requests waited."""
    out: dict[str, dict[str, Any]] = {}
    for tenant in sorted({r.tenant for r in requests}):
        own = [r for r in requests if r.tenant == tenant]
        done = [r for r in own if r.status == "ok"]
        out[tenant] = {
            "requests": len(own),
            "served": len(done),
            "throttled": sum(r.status == "throttled" for r in own),
            "shed": sum(r.status == "shed" for r in own),
            "ttft_p90_s": percentile(ttfts(done), 90),
            "queued_mean_s": float(np.mean([r.queued_s for r in done])) if done else None,
        }
    return out
