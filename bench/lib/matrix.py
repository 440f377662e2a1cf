"""The evaluation matrix's shared ground: its workloads (traces and generators, with their
SLOs), its policies and ablations, the cluster they run on, and the load calibration (the
rate scale that keeps the GPUs a given share busy). The replay study (bench/replay) runs the
matrix; the DualMap SLO, multi-router and SMetric studies replay its cells, reading the
committed calibration fit with :func:`committed_scale`."""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from enginesim.engine.fleet import FleetVariation
from enginesim.replay import invariant, metrics
from enginesim.replay.simulator import SimConfig, SimResult, Simulator
from enginesim.replay.synth import AgenticParams, BurstParams, agentic_sessions, hotspot_burst
from enginesim.replay.traces import (
    TraceRecord,
    read_bailian_rows,
    read_trace,
    retime,
    select,
)
from router_worker.routing import REGISTRY

REPO = Path(__file__).resolve().parents[2]
TRACE_DIR = REPO.parent / "shared" / "traces"
CONVERSATION = TRACE_DIR / "mooncake_conversation_t0-2700s.jsonl"
SYNTHETIC = TRACE_DIR / "mooncake_synthetic_trace.jsonl"
AZURE_CODE = TRACE_DIR / "AzureLLMInferenceTrace_code.csv"
AZURE_CONV = TRACE_DIR / "AzureLLMInferenceTrace_conv.csv"
CALIBRATION_POLICY = "cache_aware"
MAIN_MODEL, HEADLINE_MODEL = "qwen2-7b", "qwen3-30b-a3b"
# Qwen2-7B serves 131072 tokens with YaRN (Qwen3 likewise); Mooncake prompts reach 125k.
BASE = SimConfig(instances=16, gpu="h20", model=MAIN_MODEL, max_model_len=131072, seed=1)
# the replay study's committed run: its calibration fit sets the other studies' rates
MATRIX = REPO / "bench" / "replay" / "matrix.json"

# ----------------------------------------------------------------- workloads


class Build(Protocol):
    """A workload's requests at rate scale 1: the first ``limit`` of them (all: None), for
    ``replicate`` (a generated workload draws replicate i with its generator seed + i)."""

    def __call__(self, limit: int | None, replicate: int = 0) -> list[TraceRecord]: ...


@dataclass(frozen=True)
class Workload:
    """Requests at rate scale 1, the SLOs they are judged by, and how they were made."""

    name: str
    source: str
    build: Build
    slo_ttft_s: float
    slo_tpot_s: float
    params: dict[str, Any] = field(default_factory=dict)
    sim: dict[str, Any] = field(default_factory=dict)  # SimConfig fields it overrides
    generated: bool = False  # drawn by a generator (else a recorded trace, resampled per seed)
    trace: Path | None = None  # a recorded trace's file
    window_s: float | None = None  # its window's length (None: the whole trace)

    @property
    def slo(self) -> metrics.Slo:
        return metrics.Slo(self.slo_ttft_s, self.slo_tpot_s)


# How a seed resamples a recorded trace and the engines (module docstring of
# bench/replay/run.py, "Seeds"): the window's start, the arrivals' re-timing and each
# engine's per-step jitter all draw from replicate i's generator.
RETIME_BIN_S = 30.0
ENGINE_JITTER = 0.05  # log-sd of each engine step's lognormal factor (mean 1)
RESAMPLE_SEED = 20260


def window_start(records: list[TraceRecord], window_s: float | None, replicate: int) -> float:
    """Replicate i's window start: uniform over the trace's span that leaves a whole
    window (0 for a whole trace, or one no longer than the window)."""
    if window_s is None:
        return 0.0
    room = records[-1].arrival_s - records[0].arrival_s - window_s
    rng = np.random.default_rng(RESAMPLE_SEED + replicate)
    return float(records[0].arrival_s + rng.uniform(0.0, room)) if room > 0 else 0.0


def _trace_window(path: Path, window_s: float | None) -> Build:
    def build(limit: int | None, replicate: int = 0) -> list[TraceRecord]:
        records = read_trace(path)
        start = window_start(records, window_s, replicate)
        end = None if window_s is None else start + window_s
        chosen = select(records, start_s=start, end_s=end, max_requests=limit)
        return retime(chosen, RESAMPLE_SEED + replicate, RETIME_BIN_S)

    return build


AGENTIC = AgenticParams(
    sessions=640,
    session_rate=0.8,
    system_prompts=8,
    system_zipf=1.1,
    system_tokens=3072,
    mean_turns=7.0,
    max_turns=30,
    tool_turn_prob=0.6,
    user_tokens=300.0,
    tool_tokens=1200.0,
    reply_tokens=250.0,
    think_gap_s=15.0,
    tool_gap_s=2.0,
    seed=7,
)
# The agentic workload again, with a global KV tier (SMetric's setting): a pool of about
# 0.9 TB (10^6 Qwen2-7B blocks) that every instance writes through to and loads misses
# from, reached over one 25 GB/s link (a 200 Gb/s NIC) per 8-GPU host, shared by that
# host's reads.
AGENTIC_TIER = {
    "global_tier_blocks": 1_000_000,
    "global_tier_bandwidth": 25e9,
    "global_tier_link_instances": 8,
}
BURST = BurstParams(
    at_s=240.0,
    duration_s=180.0,
    burst_rate=6.0,
    prefix_tokens=16_384,
    suffix_tokens=300.0,
    output_tokens=400.0,
    seed=7,
)
BURST_BACKGROUND_S = 600.0


def _agentic(limit: int | None, replicate: int = 0) -> list[TraceRecord]:
    params = replace(AGENTIC, seed=AGENTIC.seed + replicate)
    return read_bailian_rows(agentic_sessions(params))[:limit]


def _burst(limit: int | None, replicate: int = 0) -> list[TraceRecord]:
    background = select(read_trace(CONVERSATION), end_s=BURST_BACKGROUND_S)
    return hotspot_burst(background, replace(BURST, seed=BURST.seed + replicate))[:limit]


def _generator(params: dict[str, Any]) -> dict[str, Any]:
    """The generator's parameters as the report shows them: the seed of replicate i."""
    return {**params, "seed": f"{params['seed']}+i"}


WORKLOADS = (
    Workload(
        "conversation",
        "Mooncake conversation trace, whole (45 min)",
        _trace_window(CONVERSATION, None),
        5.0,
        0.1,
        trace=CONVERSATION,
    ),
    Workload(
        "synthetic",
        "Mooncake synthetic trace, whole",
        _trace_window(SYNTHETIC, None),
        5.0,
        0.1,
        trace=SYNTHETIC,
    ),
    Workload(
        "azure_code",
        "Azure 2023 code trace, a 2400 s window at a seeded start (no prefix information: "
        "every prompt private)",
        _trace_window(AZURE_CODE, 2400.0),
        2.0,
        0.05,
        trace=AZURE_CODE,
        window_s=2400.0,
    ),
    Workload(
        "azure_conv",
        "Azure 2023 conversation trace, a 1200 s window at a seeded start (no prefix "
        "information: every prompt private)",
        _trace_window(AZURE_CONV, 1200.0),
        2.0,
        0.05,
        trace=AZURE_CONV,
        window_s=1200.0,
    ),
    Workload(
        "agentic",
        "enginesim agentic sessions (Bailian format, 16-token blocks)",
        _agentic,
        2.0,
        0.05,
        _generator(asdict(AGENTIC)),
        generated=True,
    ),
    Workload(
        "agentic_tier",
        "enginesim agentic sessions as above, on a cluster with a global "
        "KV tier (1M blocks, one 25 GB/s link per 8-GPU host)",
        _agentic,
        2.0,
        0.05,
        {**_generator(asdict(AGENTIC)), **AGENTIC_TIER},
        AGENTIC_TIER,
        generated=True,
    ),
    Workload(
        "burst",
        f"Mooncake conversation, first {BURST_BACKGROUND_S:g} s, plus a "
        "shared-long-prefix burst (enginesim hotspot generator)",
        _burst,
        5.0,
        0.1,
        {**_generator(asdict(BURST)), "background_s": BURST_BACKGROUND_S},
        generated=True,
    ),
)
WORKLOAD_BY_NAME = {w.name: w for w in WORKLOADS}

# ----------------------------------------------------------------- policies

# name → (registry kind, params). LMetric's ablations: its batch offset c (0 = the paper's
# exact score), and the paper's two indicator ablations and the detector, at the default c.
POLICIES: dict[str, tuple[str, dict[str, Any]]] = {kind: (kind, {}) for kind in REGISTRY}
# The baselines: the registry's policies that are not ours (what the invariant does not bind).
BASELINES = tuple(p for p in POLICIES if p not in invariant.OWN_POLICIES)
ABLATIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "lmetric[paper]": ("lmetric", {"batch_offset": 0.0, "tier_token_cost": None}),
    **{f"lmetric[c={c}]": ("lmetric", {"batch_offset": float(c)}) for c in (4, 16, 32, 48, 64)},
    "lmetric[miss_ratio]": ("lmetric", {"prefill_term": "miss_ratio"}),
    "lmetric[total_tokens]": ("lmetric", {"load_term": "total_tokens"}),
    "lmetric[decode_step]": ("lmetric", {"load_term": "decode_step"}),
    "lmetric[no_hotspot]": ("lmetric", {"hotspot": {"enabled": False}}),
}
# Run only where the cluster has a global KV tier (elsewhere they are LMetric itself).
TIER_ABLATIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "lmetric[no_tier]": ("lmetric", {"tier_token_cost": None}),
}
ALL_POLICIES = {**POLICIES, **ABLATIONS, **TIER_ABLATIONS}


def config_for(
    model: str,
    policy: str | None = None,
    workload: str | None = None,
    replicate: int = 0,
    gpu: str | None = None,
    params: dict[str, Any] | None = None,
) -> SimConfig:
    """Replicate ``replicate``'s cluster (the matrix's, or ``gpu``'s) for ``policy`` (a
    name of ALL_POLICIES; ``params`` overrides its parameters)."""
    chosen = {} if policy is None else {ALL_POLICIES[policy][0]: ALL_POLICIES[policy][1]}
    if policy is not None and params is not None:
        chosen = {ALL_POLICIES[policy][0]: {**ALL_POLICIES[policy][1], **params}}
    cluster = {**(WORKLOAD_BY_NAME[workload].sim if workload else {})}
    if gpu is not None:
        cluster["gpu"] = gpu
    seed = BASE.seed + replicate
    engines = FleetVariation(step_jitter=ENGINE_JITTER, seed=RESAMPLE_SEED + replicate)
    return replace(BASE, model=model, policy_params=chosen, seed=seed, variation=engines, **cluster)


def simulate(
    records: list[TraceRecord],
    policy: str,
    model: str,
    workload: str | None = None,
    replicate: int = 0,
    gpu: str | None = None,
    params: dict[str, Any] | None = None,
) -> SimResult:
    started = time.perf_counter()
    config = config_for(model, policy, workload, replicate, gpu, params)
    result = Simulator(records, ALL_POLICIES[policy][0], config).run()
    result.wall_s = time.perf_counter() - started
    result.policy = policy
    return result


def offered_load(
    records: list[TraceRecord], model: str, workload: str | None = None, gpu: str | None = None
) -> float:
    result = simulate(records, CALIBRATION_POLICY, model, workload, gpu=gpu)
    return result.busy_time / (BASE.instances * max(records[-1].arrival_s, 1e-9))


def calibrate(
    records: list[TraceRecord], model: str, workload: str | None = None, gpu: str | None = None
) -> dict[str, float]:
    """Fit ``busy = a·scale^k`` from two runs (see the module docstring)."""
    first = offered_load(records, model, workload, gpu)
    second_scale = 0.5 / first
    second = offered_load(select(records, rate_scale=second_scale), model, workload, gpu)
    k = math.log(second / first) / math.log(second_scale) if second_scale != 1 else 1.0
    return {"busy_at_1": first, "scale_2": second_scale, "busy_at_2": second, "a": first, "k": k}


def scale_for(fit: dict[str, float], load: int) -> float:
    return float(f"{(load / 100 / fit['a']) ** (1 / fit['k']):.3g}")


def committed_scale(workload: str, load: int, model: str = MAIN_MODEL) -> float:
    """The rate scale for ``load`` % busy from the committed matrix run's calibration fit."""
    fits = json.loads(MATRIX.read_text())["calibration"]
    return scale_for(fits[f"{workload}@{model}"], load)


def machine() -> str:
    import os
    import platform

    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as handle:
            cpu = next(
                line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")
            )
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores (shared), Python {platform.python_version()}"
