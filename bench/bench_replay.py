"""The evaluation matrix: workloads × loads × policies, replayed on enginesim.

    .venv/bin/python bench/bench_replay.py [--quick] [--jobs 2] [--out DIR]
    .venv/bin/python bench/bench_replay.py --workload agentic --load 50 --policy lmetric

Every routing claim Switchyard makes is a number from this table (docs/algorithms.md).
Each cell is one workload at one offered load on one cluster; each policy (every one of
the registry, plus LMetric's ablations) replays the cell's requests through the very
policy and indicator code the live router runs. Writes ``README.md`` (tables and the
decisions drawn from them), ``matrix.json`` (every number), ``heatmap.png`` (policy ×
cell, colour = mean TTFT ÷ the zero-queue, infinite-cache bound) and one TTFT CDF per
cell under ``--out``.

Loads: the rate scale at which the calibration policy (``cache_aware``) keeps the GPUs
30/50/70/90% busy over the arrival span (engine step time ÷ (instances × first-to-last
arrival): the offered load). Two runs per workload and model fit ``busy = a·scale^k``
(one at scale 1, one at the scale that line predicts for 50%); each target's scale is
read from the fit, and every row reports the busy fraction it really had.

LMetric's ablations (its batch offset c, the paper's P-token and BS ablations, the
detector off) run on every Qwen2-7B cell, and a table ranks every variant over the whole
matrix: that table is where the default parameters come from.

``--quick`` runs a reduced matrix (900 requests per workload, loads 50 and 70, no
ablations) in a few minutes into ``bench/out/``; the full matrix's run time is in
bench/replay_report/README.md.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from engine_interface import percentile
from enginesim.replay import metrics, plots
from enginesim.replay.simulator import SimConfig, SimResult, Simulator
from enginesim.replay.synth import AgenticParams, HotspotParams, agentic_sessions, hotspot_burst
from enginesim.replay.traces import TraceRecord, read_bailian_rows, read_trace, select
from router_worker.routing import REGISTRY

TRACE_DIR = Path(__file__).resolve().parents[2] / "shared" / "traces"
CONVERSATION = TRACE_DIR / "mooncake_conversation_t0-2700s.jsonl"
SYNTHETIC = TRACE_DIR / "mooncake_synthetic_trace.jsonl"
AZURE_CODE = TRACE_DIR / "AzureLLMInferenceTrace_code.csv"
AZURE_CONV = TRACE_DIR / "AzureLLMInferenceTrace_conv.csv"
CALIBRATION_POLICY = "cache_aware"
MAIN_MODEL, HEADLINE_MODEL = "qwen2-7b", "qwen3-30b-a3b"
# Qwen2-7B serves 131072 tokens with YaRN (Qwen3 likewise); Mooncake prompts reach 125k.
BASE = SimConfig(instances=16, gpu="h20", model=MAIN_MODEL, max_model_len=131072, seed=1)


# ----------------------------------------------------------------- workloads


@dataclass(frozen=True)
class Workload:
    """Requests at rate scale 1, the SLOs they are judged by, and how they were made."""

    name: str
    source: str
    build: Callable[[int | None], list[TraceRecord]]
    slo_ttft_s: float
    slo_tpot_s: float
    params: dict[str, Any] = field(default_factory=dict)
    sim: dict[str, Any] = field(default_factory=dict)  # SimConfig fields it overrides


def _trace_window(path: Path, end_s: float | None) -> Callable[[int | None], list[TraceRecord]]:
    def build(limit: int | None) -> list[TraceRecord]:
        return select(read_trace(path), end_s=end_s, max_requests=limit)

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
BURST = HotspotParams(
    at_s=240.0,
    duration_s=180.0,
    burst_rate=6.0,
    prefix_tokens=16_384,
    suffix_tokens=300.0,
    output_tokens=400.0,
    seed=7,
)
BURST_BACKGROUND_S = 600.0


def _agentic(limit: int | None) -> list[TraceRecord]:
    return read_bailian_rows(agentic_sessions(AGENTIC))[:limit]


def _burst(limit: int | None) -> list[TraceRecord]:
    background = select(read_trace(CONVERSATION), end_s=BURST_BACKGROUND_S)
    return hotspot_burst(background, BURST)[:limit]


WORKLOADS = (
    Workload(
        "conversation",
        "Mooncake conversation trace, whole (45 min)",
        _trace_window(CONVERSATION, None),
        5.0,
        0.1,
    ),
    Workload(
        "synthetic", "Mooncake synthetic trace, whole", _trace_window(SYNTHETIC, None), 5.0, 0.1
    ),
    Workload(
        "azure_code",
        "Azure 2023 code trace, first 2400 s (no prefix information: every prompt private)",
        _trace_window(AZURE_CODE, 2400.0),
        2.0,
        0.05,
    ),
    Workload(
        "azure_conv",
        "Azure 2023 conversation trace, first 1200 s (no prefix information: every prompt private)",
        _trace_window(AZURE_CONV, 1200.0),
        2.0,
        0.05,
    ),
    Workload(
        "agentic",
        "enginesim agentic sessions (Bailian format, 16-token blocks)",
        _agentic,
        2.0,
        0.05,
        asdict(AGENTIC),
    ),
    Workload(
        "agentic_tier",
        "enginesim agentic sessions as above, on a cluster with a global "
        "KV tier (1M blocks, one 25 GB/s link per 8-GPU host)",
        _agentic,
        2.0,
        0.05,
        {**asdict(AGENTIC), **AGENTIC_TIER},
        AGENTIC_TIER,
    ),
    Workload(
        "burst",
        f"Mooncake conversation, first {BURST_BACKGROUND_S:g} s, plus a "
        "shared-long-prefix burst (enginesim hotspot generator)",
        _burst,
        5.0,
        0.1,
        {**asdict(BURST), "background_s": BURST_BACKGROUND_S},
    ),
)
WORKLOAD_BY_NAME = {w.name: w for w in WORKLOADS}

# ----------------------------------------------------------------- policies

# name → (registry kind, params). LMetric's ablations: its batch offset c (0 = the paper's
# exact score), and the paper's two indicator ablations and the detector, at the default c.
POLICIES: dict[str, tuple[str, dict[str, Any]]] = {kind: (kind, {}) for kind in REGISTRY}
# What LMetric is measured against: the seven policies of its papers and production routers
# (docs/algorithms.md).
BASELINES = ("round_robin", "least_load", "linear", "cache_aware", "preble", "dualmap", "smetric")
ABLATIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "lmetric[paper]": ("lmetric", {"batch_offset": 0.0, "tier_token_cost": None}),
    **{f"lmetric[c={c}]": ("lmetric", {"batch_offset": float(c)}) for c in (1, 16, 32, 64)},
    "lmetric[miss_ratio]": ("lmetric", {"prefill_term": "miss_ratio"}),
    "lmetric[total_tokens]": ("lmetric", {"load_term": "total_tokens"}),
    "lmetric[no_hotspot]": ("lmetric", {"hotspot": {"enabled": False}}),
}
# Run only where the cluster has a global KV tier (elsewhere they are LMetric itself).
TIER_ABLATIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "lmetric[no_tier]": ("lmetric", {"tier_token_cost": None}),
}
ALL_POLICIES = {**POLICIES, **ABLATIONS, **TIER_ABLATIONS}


@dataclass(frozen=True)
class Cell:
    workload: str
    model: str
    load: int  # target offered load, percent

    @property
    def key(self) -> str:
        model = "" if self.model == MAIN_MODEL else f"@{self.model}"
        return f"{self.workload}{model}/{self.load}"


def config_for(model: str, policy: str | None = None, workload: str | None = None) -> SimConfig:
    params = {} if policy is None else {ALL_POLICIES[policy][0]: ALL_POLICIES[policy][1]}
    cluster = WORKLOAD_BY_NAME[workload].sim if workload else {}
    return replace(BASE, model=model, policy_params=params, **cluster)


# ----------------------------------------------------------------- running


def simulate(
    records: list[TraceRecord], policy: str, model: str, workload: str | None = None
) -> SimResult:
    started = time.perf_counter()
    result = Simulator(records, ALL_POLICIES[policy][0], config_for(model, policy, workload)).run()
    result.wall_s = time.perf_counter() - started
    result.policy = policy
    return result


def offered_load(records: list[TraceRecord], model: str, workload: str | None = None) -> float:
    result = simulate(records, CALIBRATION_POLICY, model, workload)
    return result.busy_time / (BASE.instances * max(records[-1].arrival_s, 1e-9))


def calibrate(
    records: list[TraceRecord], model: str, workload: str | None = None
) -> dict[str, float]:
    """Fit ``busy = a·scale^k`` from two runs (see the module docstring)."""
    first = offered_load(records, model, workload)
    second_scale = 0.5 / first
    second = offered_load(select(records, rate_scale=second_scale), model, workload)
    k = math.log(second / first) / math.log(second_scale) if second_scale != 1 else 1.0
    return {"busy_at_1": first, "scale_2": second_scale, "busy_at_2": second, "a": first, "k": k}


def scale_for(fit: dict[str, float], load: int) -> float:
    return float(f"{(load / 100 / fit['a']) ** (1 / fit['k']):.3g}")


def _job(args: tuple[Cell, str, float, int | None]) -> tuple[str, str, SimResult]:
    cell, policy, scale, limit = args
    records = select(WORKLOAD_BY_NAME[cell.workload].build(limit), rate_scale=scale)
    return cell.key, policy, simulate(records, policy, cell.model, cell.workload)


def _calibration_job(args: tuple[str, str, int | None]) -> tuple[str, str, dict[str, float]]:
    workload, model, limit = args
    return workload, model, calibrate(WORKLOAD_BY_NAME[workload].build(limit), model, workload)


# ----------------------------------------------------------------- summaries


def summarize(result: SimResult, workload: Workload, bounds: np.ndarray) -> dict[str, Any]:
    summary = metrics.summarize(result)
    done = [r for r in result.requests if r.status == "ok"]
    ttft = metrics.ttfts(done)
    good = metrics.slo_met(done, workload.slo_ttft_s, workload.slo_tpot_s)
    arrivals = [r.arrival_s for r in result.requests]
    span = max(max(arrivals) - min(arrivals), 1e-9)
    bound_mean = float(bounds.mean()) if len(bounds) else float("nan")
    summary.update(
        ttft_p95_s=percentile(ttft, 95),
        slo_attainment=good / max(len(result.requests), 1),
        goodput_rps=good / span,
        ttft_over_bound=(
            summary["ttft_mean_s"] / bound_mean if summary["ttft_mean_s"] is not None else None
        ),
        hotspot_confirmed=result.hotspot_events.get("confirmed", 0),
    )
    if "tier" in summary:  # flat copies for the cell table
        tier = summary["tier"]
        summary.update(
            tier_hit_ratio=tier["hit_ratio"],
            tier_gb=tier["bytes_read"] / 1e9,
            tier_wait_s=tier["read_wait_s"],
        )
    return summary


# ----------------------------------------------------------------- report

COLUMNS = (
    ("TTFT mean", "ttft_mean_s", ".2f"),
    ("p50", "ttft_p50_s", ".2f"),
    ("p95", "ttft_p95_s", ".2f"),
    ("p99", "ttft_p99_s", ".2f"),
    ("÷ bound", "ttft_over_bound", ".2f"),
    ("TPOT mean", "tpot_mean_s", ".4f"),
    ("TPOT p99", "tpot_p99_s", ".3f"),
    ("SLO met", "slo_attainment", ".3f"),
    ("goodput r/s", "goodput_rps", ".2f"),
    ("hit", "hit_ratio", ".3f"),
    ("busy", "busy_fraction", ".2f"),
    ("hotspots", "hotspot_confirmed", "d"),
    ("rejected", "rejected", "d"),
)
# cells whose cluster has a global KV tier add: prompt share loaded from it, GB read, and
# seconds the reads queued behind other instances' reads on their host's link
TIER_COLUMNS = (
    ("tier hit", "tier_hit_ratio", ".3f"),
    ("tier GB", "tier_gb", ".1f"),
    ("tier wait s", "tier_wait_s", ".2f"),
)


def cell_table(rows: list[dict[str, Any]], lower: dict[str, Any]) -> list[str]:
    best = min(r["ttft_mean_s"] for r in rows if r["policy"] in POLICIES)
    columns = COLUMNS + (TIER_COLUMNS if any("tier" in r for r in rows) else ())
    lines = [
        "| policy | " + " | ".join(c[0] for c in columns) + " |",
        "|---|" + "---:|" * len(columns),
    ]
    for row in [*rows, lower]:
        cells = []
        for _, key, spec in columns:
            value = row.get(key)
            cells.append("–" if value is None else format(value, spec))
        name = row["policy"]
        label = "*lower bound*" if name == "lower_bound" else f"`{name}`"
        if row.get("ttft_mean_s") == best and name in POLICIES:
            label = f"**{label}**"
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def against_best(
    rows: dict[str, dict[str, Any]], policy: str, others: Sequence[str]
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The rows of ``others`` with the best mean and the best p99 TTFT in one cell."""
    candidates = [rows[name] for name in others if name in rows and name != policy]
    if policy not in rows or not candidates:
        return None
    return (
        min(candidates, key=lambda r: r["ttft_mean_s"]),
        min(candidates, key=lambda r: r["ttft_p99_s"]),
    )


def gap_table(cells: dict[str, dict[str, Any]], policy: str, others: Sequence[str]) -> list[str]:
    """Per cell: ``policy``'s mean and p99 TTFT against the best of ``others``."""
    lines = [
        f"| cell | {policy} mean | best other | gap | ÷ bound | {policy} p99 | "
        "best other p99 | gap |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, cell in cells.items():
        rows = {r["policy"]: r for r in cell["policies"]}
        best = against_best(rows, policy, others)
        if best is None:
            continue
        row, (mean, p99) = rows[policy], best
        lines.append(
            f"| {key} | {row['ttft_mean_s']:.2f} | {mean['ttft_mean_s']:.2f} "
            f"(`{mean['policy']}`) | {row['ttft_mean_s'] / mean['ttft_mean_s'] - 1:+.1%} | "
            f"{row['ttft_over_bound']:.2f} | {row['ttft_p99_s']:.2f} | "
            f"{p99['ttft_p99_s']:.2f} (`{p99['policy']}`) | "
            f"{row['ttft_p99_s'] / p99['ttft_p99_s'] - 1:+.1%} |"
        )
    return lines


def smetric_table(cells: dict[str, dict[str, Any]]) -> list[str]:
    """SMetric's two goals per cell: mean TTFT at most ``least_load``'s everywhere, and on
    the agentic (session) workloads the best policy or within 5% of the best."""
    lines = [
        "| cell | smetric mean | least_load | ≤ least_load | best other | gap | goal |",
        "|---|---:|---:|---|---:|---:|---|",
    ]
    for key, cell in cells.items():
        rows = {r["policy"]: r for r in cell["policies"]}
        if "smetric" not in rows or "least_load" not in rows:
            continue
        mean = rows["smetric"]["ttft_mean_s"]
        floor_ok = mean <= rows["least_load"]["ttft_mean_s"]
        best = against_best(rows, "smetric", list(POLICIES))
        assert best is not None  # POLICIES is not empty
        gap = mean / best[0]["ttft_mean_s"] - 1
        sessions = cell["workload"].startswith("agentic")
        met = floor_ok and (not sessions or gap <= 0.05)
        lines.append(
            f"| {key} | {mean:.3f} | {rows['least_load']['ttft_mean_s']:.3f} | "
            f"{'yes' if floor_ok else '**no**'} | "
            f"{best[0]['ttft_mean_s']:.3f} (`{best[0]['policy']}`) | {gap:+.1%} | "
            f"{'met' if met else '**missed**'}{' (sessions: ≤ 5%)' if sessions else ''} |"
        )
    return lines


def variant_summary(cells: dict[str, dict[str, Any]]) -> list[str]:
    """Each LMetric variant over the whole matrix: how it stands against the best of the
    seven baselines (geometric mean of the mean-TTFT ratio; cells missing the goal:
    mean more than 5% or p99 more than 10% behind)."""
    variants = ["lmetric", *ABLATIONS, *TIER_ABLATIONS]  # the tier ones: tier cells only
    lines = [
        "| variant | cells | mean TTFT ÷ best other, up to 70% busy (geo. mean) | "
        "cells missing the goal | at 90% busy (geo. mean) | missing at 90% |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for variant in variants:
        low, high, missing_low, missing_high, count = [], [], 0, 0, 0
        for cell in cells.values():
            rows = {r["policy"]: r for r in cell["policies"]}
            best = against_best(rows, variant, BASELINES)
            if best is None:
                continue
            count += 1
            ratio = rows[variant]["ttft_mean_s"] / best[0]["ttft_mean_s"]
            p99 = rows[variant]["ttft_p99_s"] / best[1]["ttft_p99_s"]
            miss = ratio > 1.05 or p99 > 1.10
            if cell["load"] <= 70:
                low.append(math.log(ratio))
                missing_low += miss
            else:
                high.append(math.log(ratio))
                missing_high += miss
        if count:
            lines.append(
                f"| `{variant}` | {count} | {_geo(low)} | {missing_low} | "
                f"{_geo(high)} | {missing_high} |"
            )
    return lines


def _geo(logs: list[float]) -> str:
    return f"{math.exp(sum(logs) / len(logs)):.3f}" if logs else "–"


def heatmap(cells: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib.pyplot as plt

    keys = list(cells)
    names = [
        p
        for p in ALL_POLICIES
        if any(r["policy"] == p for c in cells.values() for r in c["policies"])
    ]
    grid = np.full((len(names), len(keys)), np.nan)
    for j, key in enumerate(keys):
        for row in cells[key]["policies"]:
            if row["policy"] in names and row["ttft_over_bound"] is not None:
                grid[names.index(row["policy"]), j] = row["ttft_over_bound"]
    fig, ax = plt.subplots(figsize=(1.0 + 0.55 * len(keys), 1.2 + 0.38 * len(names)))
    shown = np.log10(np.clip(grid, 1.0, 100.0))
    image = ax.imshow(shown, cmap="RdYlGn_r", vmin=0.0, vmax=1.3, aspect="auto")
    for (i, j), value in np.ndenumerate(grid):
        if np.isfinite(value):
            ax.text(
                j, i, f"{value:.1f}" if value < 100 else ">99", ha="center", va="center", fontsize=6
            )
    ax.set_xticks(range(len(keys)), keys, rotation=60, ha="right", fontsize=7)
    ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.set_title("mean TTFT ÷ zero-queue, infinite-cache bound (lower is better)", fontsize=9)
    bar = fig.colorbar(image, ax=ax, fraction=0.03)
    bar.set_ticks([0, 0.3, 0.6, 1.0, 1.3], labels=["1", "2", "4", "10", "20"])
    plots.save(fig, path)


def report(out: Path, data: dict[str, Any], header: list[str]) -> None:
    cells = data["cells"]
    lines = [
        *header,
        "",
        "## LMetric against the best of the seven baselines, per cell",
        "",
        *gap_table(cells, "lmetric", BASELINES),
        "",
        "![heatmap](heatmap.png)",
        "",
        "## predicted_ttft against the best other policy, per cell",
        "",
        *gap_table(cells, "predicted_ttft", list(POLICIES)),
        "",
        "## LMetric's variants over the whole matrix",
        "",
        *variant_summary(cells),
        "",
        "## SMetric never collapses",
        "",
        "Goal: mean TTFT at most `least_load`'s in every cell; on the agentic (multi-turn "
        "session) workloads, the best policy or within 5% of the best. SMetric's own "
        "experiment — goodput against offered rate with and without the global KV "
        "tier — is [bench/smetric_report](../smetric_report/README.md).",
        "",
        *smetric_table(cells),
        "",
        "![SMetric goodput](../smetric_report/goodput.png)",
        "",
    ]
    for key, cell in cells.items():
        workload = WORKLOAD_BY_NAME[cell["workload"]]
        lines += [
            f"## {key}",
            "",
            f"{workload.source}; {cell['requests']} requests on 16× H20 "
            f"{cell['model']}, rate scale {cell['rate_scale']:g} (target "
            f"{cell['load']}% busy); SLO TTFT ≤ {workload.slo_ttft_s:g} s and "
            f"TPOT ≤ {workload.slo_tpot_s * 1000:g} ms.",
            "",
            *cell_table(cell["policies"], cell["lower_bound"]),
            "",
            f"![TTFT CDF]({cell['cdf']})",
            "",
        ]
    for extra in ("hotspot.md", "NOTES.md"):  # bench_hotspot.py's sweep; the observations
        if (out / extra).exists():
            lines += [(out / extra).read_text()]
    (out / "README.md").write_text("\n".join(lines) + "\n")


def header_lines(data: dict[str, Any]) -> list[str]:
    lines = [
        "# Evaluation matrix",
        "",
        f"Generated by `bench/bench_replay.py{' --quick' if data['quick'] else ''}` on "
        f"{data['machine']} in {data['wall_s'] / 60:.1f} min."
        + (f" Note: {data['rerun_note']}." if data.get("rerun_note") else ""),
        "",
        "16× H20, max_model_len 131072, vLLM v1 defaults from enginesim; router block "
        "size 16, scrapes every 1 s, no telemetry delay, shadow KV index (no KV "
        f"events), seed {BASE.seed}. Times are virtual seconds. `÷ bound` is the mean "
        "TTFT over the mean of the zero-queue, infinite-cache lower bound (each request "
        "prefilled alone on an idle engine that caches every earlier request's "
        "prompt). `SLO met` counts requests meeting both the TTFT and the TPOT SLO "
        "(rejected ones miss); `goodput` is those per second of arrivals. `hotspots` "
        "counts confirmed hotspot classes. The best mean TTFT among the registry's "
        f"{len(POLICIES)} policies is in bold; `lmetric[...]` rows are LMetric's "
        "ablations.",
        "",
        "## Workloads",
        "",
        "| workload | source | SLO TTFT / TPOT | generator |",
        "|---|---|---|---|",
    ]
    for workload in WORKLOADS:
        params = ", ".join(f"{k}={v}" for k, v in workload.params.items()) or "–"
        lines.append(
            f"| `{workload.name}` | {workload.source} | {workload.slo_ttft_s:g} s / "
            f"{workload.slo_tpot_s * 1000:g} ms | {params} |"
        )
    lines += [
        "",
        "Calibration (`cache_aware`, offered load = busy ÷ (instances × arrival "
        "span); fit busy = a·scale^k):",
        "",
        "| workload, model | busy at 1 | second scale | busy there | k |",
        "|---|---:|---:|---:|---:|",
    ]
    for key, fit in data["calibration"].items():
        lines.append(
            f"| {key} | {fit['busy_at_1']:.3f} | {fit['scale_2']:.3f} | "
            f"{fit['busy_at_2']:.3f} | {fit['k']:.2f} |"
        )
    return lines


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


# ----------------------------------------------------------------- main


def plan(args: argparse.Namespace) -> tuple[list[Cell], list[str], list[str]]:
    workloads = args.workload or [w.name for w in WORKLOADS]
    loads = args.load or ([50, 70] if args.quick else [30, 50, 70, 90])
    cells = [Cell(w, MAIN_MODEL, load) for w in workloads for load in loads]
    if not args.load and not args.no_headline:
        cells += [Cell(w, HEADLINE_MODEL, 50) for w in workloads]
    policies = args.policy or list(POLICIES)
    ablations = [] if args.policy or args.quick else [c.key for c in cells if c.model == MAIN_MODEL]
    return cells, policies, ablations


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out",
        type=Path,
        help="default: bench/replay_report, or "
        "bench/out/ with --quick (the committed report stays untouched)",
    )
    parser.add_argument("--quick", action="store_true", help="a reduced matrix in minutes")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--workload", action="append", choices=list(WORKLOAD_BY_NAME))
    parser.add_argument("--load", action="append", type=int, help="target busy percent")
    parser.add_argument("--policy", action="append", choices=list(ALL_POLICIES))
    parser.add_argument(
        "--no-headline", action="store_true", help=f"skip the {HEADLINE_MODEL} cells"
    )
    parser.add_argument(
        "--assemble",
        action="store_true",
        help="run nothing: rebuild README.md from matrix.json, hotspot.md and NOTES.md",
    )
    args = parser.parse_args(argv)
    if args.out is None:
        here = Path(__file__).parent
        args.out = here / "out" if args.quick else here / "replay_report"
    if args.assemble:
        data: dict[str, Any] = json.loads((args.out / "matrix.json").read_text())
        report(args.out, data, header_lines(data))
        return 0
    limit = 900 if args.quick else None
    cells, policies, ablation_cells = plan(args)
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        pairs = sorted({(c.workload, c.model) for c in cells})
        fits = {
            f"{w}@{m}": fit
            for w, m, fit in pool.map(_calibration_job, [(w, m, limit) for w, m in pairs])
        }
        print("calibrated:", json.dumps(fits, indent=None), flush=True)
        jobs = []
        for cell in cells:
            scale = scale_for(fits[f"{cell.workload}@{cell.model}"], cell.load)
            extra = list(ABLATIONS) if cell.key in ablation_cells else []
            if extra and WORKLOAD_BY_NAME[cell.workload].sim.get("global_tier_blocks"):
                extra += list(TIER_ABLATIONS)
            jobs += [(cell, policy, scale, limit) for policy in [*policies, *extra]]
        results: dict[str, dict[str, SimResult]] = {}
        for key, policy, result in pool.map(_job, jobs):
            results.setdefault(key, {})[policy] = result
            print(
                f"{key:<28} {policy:<22} TTFT {metrics.summarize(result)['ttft_mean_s']:.3f}"
                f" wall {result.wall_s:.1f}s",
                flush=True,
            )
    args.out.mkdir(parents=True, exist_ok=True)
    data = {
        "quick": args.quick,
        "machine": machine(),
        "calibration": fits,
        "cells": {},
    }
    for cell in cells:
        workload = WORKLOAD_BY_NAME[cell.workload]
        scale = scale_for(fits[f"{cell.workload}@{cell.model}"], cell.load)
        records = select(workload.build(limit), rate_scale=scale)
        lower, bounds = metrics.lower_bound_summary(
            records, config_for(cell.model).engine_config(None)
        )
        runs = results[cell.key]
        cdf = f"cdf_{cell.key.replace('/', '_').replace('@', '_')}.png"
        plots.ttft_cdf(list(runs.values()), args.out / cdf, f"{cell.key} (scale {scale:g})", bounds)
        data["cells"][cell.key] = {
            "workload": cell.workload,
            "model": cell.model,
            "load": cell.load,
            "rate_scale": scale,
            "requests": len(records),
            "cdf": cdf,
            "lower_bound": lower,
            "policies": [summarize(r, workload, bounds) for r in runs.values()],
        }
    data["wall_s"] = time.perf_counter() - started
    (args.out / "matrix.json").write_text(json.dumps(data, indent=1, default=float) + "\n")
    heatmap(data["cells"], args.out / "heatmap.png")
    report(args.out, data, header_lines(data))
    print(f"wrote {args.out}/README.md in {data['wall_s'] / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
