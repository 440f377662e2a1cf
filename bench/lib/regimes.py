"""The robustness suite's regimes, shared by the studies that replay them.

A regime is a workload (the long-output burst over private traffic, or a window of the
Mooncake conversation trace), loads as rate scales, and a cluster (fleet, variation,
telemetry). :func:`run_suite` replays every (regime, load, policy, seed) on a process pool;
:func:`invariant_rows` checks the never-collapse invariant per cell. The studies
(``bench/robustness/run.py``, ``bench/prediction/run.py``, ``bench/load_term/run.py``)
report on them.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from bench.lib.matrix import ENGINE_JITTER, RESAMPLE_SEED, RETIME_BIN_S, window_start
from bench.lib.stats import Estimate, mean_ci
from enginesim.engine.fleet import FleetVariation
from enginesim.replay import metrics
from enginesim.replay.invariant import OWN_POLICIES, REFERENCES, check_seeds, worst
from enginesim.replay.simulator import SimConfig, Simulator
from enginesim.replay.synth import BurstParams, hotspot_burst
from enginesim.replay.traces import TraceRecord, read_trace, retime, select
from router_worker.routing import REGISTRY

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"
CONVERSATION = TRACES / "mooncake_conversation_t0-2700s.jsonl"
CONVERSATION_WINDOW_S = 600.0
SLO = metrics.Slo(ttft_s=5.0, tpot_s=0.1)


@dataclass(frozen=True)
class LongOutputBurst:
    """Background of private prompts plus a burst sharing one long prefix."""

    background_rate: float = 1.8  # requests/s, private prompts
    background_prompt: int = 800
    background_output: int = 200
    burst: BurstParams = field(
        default_factory=lambda: BurstParams(
            at_s=10.0,
            duration_s=120.0,
            burst_rate=10.0,
            prefix_tokens=20_480,
            suffix_tokens=40.0,
            output_tokens=3_500.0,
            length_sigma=0.3,
        )
    )

    def build(self, scale: float, seed: int) -> list[TraceRecord]:
        span = self.burst.at_s + self.burst.duration_s + 20.0
        count = int(self.background_rate * span)
        background = [
            TraceRecord(i, i / self.background_rate, self.background_prompt, self.background_output)
            for i in range(count)
        ]
        burst = replace(self.burst, burst_rate=self.burst.burst_rate * scale, seed=seed)
        return hotspot_burst(background, burst)

    def describe(self) -> str:
        b = self.burst
        return (
            f"background {self.background_rate:g} req/s of private {self.background_prompt}-token "
            f"prompts ({self.background_output} output tokens); from t = {b.at_s:g} s for "
            f"{b.duration_s:g} s, {b.burst_rate:g} req/s × scale share a {b.prefix_tokens}-token "
            f"prefix, suffixes ~{b.suffix_tokens:g} tokens, outputs ~{b.output_tokens:g} tokens "
            f"(lognormal σ {b.length_sigma:g})"
        )


@lru_cache(maxsize=1)
def _conversation() -> tuple[TraceRecord, ...]:
    return tuple(read_trace(CONVERSATION))


def conversation(scale: float, seed: int) -> list[TraceRecord]:
    """A 600 s window of the Mooncake conversation trace at ``scale`` × its rate: seed k
    resamples it as the matrix resamples a recorded trace (a seeded start, then arrivals
    re-timed within bins; ``bench.lib.matrix``)."""
    records = list(_conversation())
    start = window_start(records, CONVERSATION_WINDOW_S, seed)
    window = select(records, start_s=start, end_s=start + CONVERSATION_WINDOW_S)
    return select(retime(window, RESAMPLE_SEED + seed, RETIME_BIN_S), rate_scale=scale)


BURST = LongOutputBurst()


@dataclass(frozen=True)
class Regime:
    name: str
    workload: str  # "long_output" or "conversation"
    loads: dict[str, float]  # load name → rate scale
    sim: dict[str, Any] = field(default_factory=dict)  # SimConfig fields
    variation: dict[str, Any] = field(default_factory=dict)  # FleetVariation fields

    def records(self, scale: float, seed: int) -> list[TraceRecord]:
        build: Callable[[float, int], list[TraceRecord]] = (
            BURST.build if self.workload == "long_output" else conversation
        )
        return build(scale, seed)

    def config(self, seed: int, params: dict[str, Any] | None = None) -> SimConfig:
        """The cluster of this regime; ``params``: SimConfig.policy_params (by kind)."""
        sim = {"instances": 16, "kv_events": True, **self.sim}
        jitter = {"step_jitter": ENGINE_JITTER}  # every seed's engines differ
        variation = FleetVariation(**{**jitter, **self.variation, "seed": seed})
        return SimConfig(**sim, seed=seed, policy_params=params or {}, variation=variation)


CONVERSATION_LOADS = {"low": 0.6, "high": 1.0}
BURST_LOADS = {"low": 0.6, "high": 1.0}
SLOW_SPEEDS = tuple([0.5, 0.75, 0.75, 0.75] + [1.0] * 12)
OTHER_FLEETS = (
    ("h100", "llama-3.1-8b"),
    ("a100", "qwen3-8b"),
    ("l40s", "qwen2.5-7b"),
    ("h20", "qwen3-32b"),
)


def regimes() -> list[Regime]:
    out = [
        Regime("long_output", "long_output", BURST_LOADS),
        Regime(
            "heterogeneous",
            "conversation",
            CONVERSATION_LOADS,
            variation={"speeds": SLOW_SPEEDS, "step_jitter": 0.1, "perturb": 0.2},
        ),
        Regime(
            "mixed_gpus",
            "conversation",
            CONVERSATION_LOADS,
            variation={"gpus": ("h20",) * 8 + ("h100",) * 8},
        ),
        Regime("telemetry_delay", "conversation", CONVERSATION_LOADS, {"telemetry_delay_s": 1.0}),
        Regime(
            "scrapes_only",
            "conversation",
            CONVERSATION_LOADS,
            {"kv_events": False, "scrape_interval_s": 2.0},
        ),
        Regime("routers", "conversation", CONVERSATION_LOADS, {"routers": 3}),
    ]
    for gpu, model in OTHER_FLEETS:
        fleet = {"gpu": gpu, "model": model}
        out.append(Regime(f"long_output@{gpu}+{model}", "long_output", BURST_LOADS, fleet))
        out.append(Regime(f"conversation@{gpu}+{model}", "conversation", CONVERSATION_LOADS, fleet))
    return out


# ----------------------------------------------------------------- running


def parse_variant(text: str) -> tuple[str, str, dict[str, Any]]:
    """``NAME=KIND:JSON`` → (name, kind, params), e.g. ``c0=lmetric:{"batch_offset": 0}``."""
    name, _, rest = text.partition("=")
    kind, _, params = rest.partition(":")
    if not name or kind not in REGISTRY:
        raise argparse.ArgumentTypeError(
            f"variant {text!r}: expected NAME=KIND:JSON with KIND one of {', '.join(REGISTRY)}"
        )
    try:
        parsed = json.loads(params or "{}")
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"variant {text!r}: bad JSON: {error}") from None
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(f"variant {text!r}: the params must be a JSON object")
    return name, kind, parsed


Job = tuple[Regime, str, str, tuple[str, dict[str, Any]], int]  # regime, load, name, …


def _run(job: Job) -> tuple[str, str, str, int, dict[str, Any]]:
    regime, load, policy, (kind, params), seed = job
    records = regime.records(regime.loads[load], seed)
    result = Simulator(records, kind, regime.config(seed, {kind: params})).run()
    summary = metrics.summarize(result, SLO)
    keep = (
        "goodput_rps",
        "slo_attainment",
        "ttft_mean_s",
        "ttft_p99_s",
        "tpot_mean_s",
        "tpot_p99_s",
        "throughput_tok_s",
        "busy_fraction",
        "requests",
    )
    return regime.name, load, policy, seed, {key: summary[key] for key in keep}


def run_suite(
    chosen: Sequence[Regime],
    policies: Sequence[str],
    seeds: int,
    jobs: int,
    variants: dict[str, tuple[str, dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """Every (regime, load, policy, seed); ``variants``: name → (kind, params) of the
    names in ``policies`` that are not plain policy kinds."""
    variants = variants or {}
    work: list[Job] = [
        (regime, load, policy, variants.get(policy, (policy, {})), seed)
        for regime in chosen
        for load in regime.loads
        for policy in policies
        for seed in range(1, seeds + 1)
    ]
    print(f"{len(work)} runs on {jobs} processes", flush=True)
    cells: dict[str, dict[str, list[dict[str, Any]]]] = {}
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for name, load, policy, seed, summary in pool.map(_run, work, chunksize=2):
            runs = cells.setdefault(f"{name}/{load}", {}).setdefault(policy, [])
            runs.append({"seed": seed, **summary})
    return cells


# ----------------------------------------------------------------- analysis


def estimates(runs: list[dict[str, Any]], key: str) -> Estimate:
    values = [run[key] for run in runs if run[key] is not None and math.isfinite(run[key])]
    return mean_ci(values) if values else Estimate(math.nan, math.inf, 0)


def invariant_rows(
    cells: dict[str, Any], kinds: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """Every non-reference policy's invariant check per cell, seed by seed (the runs in
    seed order); ``kinds`` names the kind of each variant (a variant of one of our policies
    is held to the invariant too, and no variant counts as a baseline)."""
    kinds = kinds or {}
    rows = []
    for key, cell in cells.items():
        runs = {policy: sorted(r, key=lambda run: run["seed"]) for policy, r in cell.items()}
        baselines = [p for p in runs if kinds.get(p, p) not in OWN_POLICIES and p not in kinds]
        for policy in cell:
            if policy in REFERENCES:
                continue
            record = worst(check_seeds(policy, runs, baselines))
            rows.append(
                {"cell": key, "policy": policy, "own": kinds.get(policy, policy) in OWN_POLICIES}
                | record
            )
    return rows
