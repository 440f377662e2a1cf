"""The evaluation matrix: workloads × loads × policies × seeds, replayed on enginesim.

    .venv/bin/python -m bench.replay.run [--quick] [--jobs 2] [--seeds 3] [--ablations]
    .venv/bin/python -m bench.replay.run --workload agentic --load 50 --policy lmetric

Operators choose a policy from this table (docs/algorithms.md), so it must not be fooled
by one lucky seed or by a policy that wins time to first token by wrecking decode. Each
cell is one workload at one offered load on one cluster; each policy of the registry
replays the cell's requests through the very policy and indicator code the live router
runs, under several seeds. The headline is goodput — requests per second meeting the
workload's TTFT *and* TPOT SLO (``enginesim.replay.metrics.goodput``) — with TTFT, TPOT
and output throughput beside it, each as mean ± 95% confidence interval over seeds, and
ties called by one rule (``bench/lib/stats.py``). The never-collapse invariant
(``enginesim.replay.invariant``) is checked for every policy in every cell.

Seeds: every seed resamples the workload and the engines. Replicate i runs simulator seed
``BASE.seed + i`` (policy tie-breaks); a generated workload (agentic sessions, the hotspot
burst) draws its requests with generator seed ``params.seed + i``; a recorded trace is
resampled: a windowed one (the Azure traces) starts at a seeded offset, and every one is
re-timed (``enginesim.replay.traces.retime``: each 30 s bin's requests at new uniform
times, order and per-bin rate kept); and every engine's step time carries its own seeded
lognormal jitter (``bench.lib.matrix.ENGINE_JITTER``).

Loads: the rate scale at which the calibration policy (``cache_aware``, replicate 0)
keeps the GPUs ``LOADS`` % busy over the arrival span (engine step time ÷ (instances ×
first-to-last arrival): the offered load). Two runs per workload and model fit
``busy = a·scale^k`` (one at scale 1, one at the scale that line predicts for 50%); each
target's scale is read from the fit, and every row reports the busy fraction it really
had. The headline model runs at one load.

Writes under ``--out`` ``README.md`` (every table and sentence generated from this run's
data), ``matrix.json`` (every run's summary, the seed means and intervals, the verdicts
and invariant checks), ``heatmap.png`` (policy × cell, colour = goodput ÷ the cell's best)
and one TTFT CDF per cell (seeds pooled). ``--assemble`` rebuilds README.md from
matrix.json alone.

``--ablations`` adds LMetric's ablations (its batch offset c, the paper's P-token and BS
ablations, the detector off) on every main-model cell and a table ranking them.
``--quick`` runs a reduced matrix (900 requests per workload, two loads, no headline
model) into ``bench/out/replay/`` in a few minutes. The run prints its planned job count and
estimated time first (``--plan``: only that), from RUN_COST_S, the CPU seconds a run of
each workload takes; each run's ``cpu_s`` in matrix.json is there to refit them.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from bench.lib import stats
from bench.lib.matrix import (
    ABLATIONS,
    ALL_POLICIES,
    BASE,
    BASELINES,
    CALIBRATION_POLICY,
    ENGINE_JITTER,
    HEADLINE_MODEL,
    MAIN_MODEL,
    POLICIES,
    RETIME_BIN_S,
    TIER_ABLATIONS,
    WORKLOAD_BY_NAME,
    WORKLOADS,
    Workload,
    calibrate,
    config_for,
    machine,
    scale_for,
    simulate,
)
from enginesim.replay import invariant, metrics, plots
from enginesim.replay.simulator import SimResult
from enginesim.replay.traces import TraceRecord, select

LOADS = (30, 60, 90)  # target offered load, percent busy
HEADLINE_LOAD = 60
QUICK_LOADS = (50, 80)
QUICK_REQUESTS = 900
SEEDS = 5  # replicates per cell

# CPU seconds of one policy run on the whole workload (the planner's estimate of its wall
# time on an idle core): the mean over the registry's policies at 60% busy, measured on the
# 2-core VM (busy with other work, which inflates CPU time by up to a third); Qwen3-30B-A3B
# runs cost the same. Refit from the runs' ``cpu_s`` in matrix.json.
RUN_COST_S = {
    "conversation": 7.5,
    "synthetic": 3.4,
    "azure_code": 3.3,
    "azure_conv": 2.8,
    "agentic": 4.5,
    "agentic_tier": 5.9,
    "burst": 2.4,
}


@dataclass(frozen=True)
class Cell:
    workload: str
    model: str
    load: int  # target offered load, percent

    @property
    def key(self) -> str:
        model = "" if self.model == MAIN_MODEL else f"@{self.model}"
        return f"{self.workload}{model}/{self.load}"


# ----------------------------------------------------------------- running


@lru_cache(maxsize=4)
def _requests(workload: str, limit: int | None, replicate: int) -> tuple[TraceRecord, ...]:
    """A workload's requests at rate scale 1, kept per worker process: its jobs come in a
    row, and a trace takes a while to parse."""
    return tuple(WORKLOAD_BY_NAME[workload].build(limit, replicate))


@dataclass(frozen=True)
class Job:
    cell: Cell
    policy: str
    scale: float
    limit: int | None
    replicate: int


@dataclass
class Run:
    """What a job sends back: its summary and its TTFTs (for the CDF), not the requests."""

    key: str
    policy: str
    replicate: int
    summary: dict[str, Any]
    ttfts: np.ndarray


def _job(job: Job) -> Run:
    workload = WORKLOAD_BY_NAME[job.cell.workload]
    records = select(_requests(workload.name, job.limit, job.replicate), rate_scale=job.scale)
    cpu = time.process_time()
    result = simulate(records, job.policy, job.cell.model, workload.name, job.replicate)
    summary = summarize(result, workload)
    # what the run costs on an idle core, whatever else the machine runs (the planner's unit)
    summary["cpu_s"] = time.process_time() - cpu
    return Run(job.cell.key, job.policy, job.replicate, summary, metrics.ttfts(result.requests))


def _calibration_job(args: tuple[str, str, int | None]) -> tuple[str, str, dict[str, float]]:
    workload, model, limit = args
    return workload, model, calibrate(list(_requests(workload, limit, 0)), model, workload)


def _bound_job(args: tuple[str, str, int | None, int]) -> tuple[tuple[str, str, int], Any]:
    """The lower bound of one workload's requests on one model: it does not depend on the
    rate scale (each request alone on an idle engine), so every load shares it."""
    workload, model, limit, replicate = args
    records = list(_requests(workload, limit, replicate))
    return (workload, model, replicate), metrics.lower_bound_summary(
        records, config_for(model).engine_config(None)
    )


# ----------------------------------------------------------------- summaries

# The per-seed numbers a row's mean and interval are taken of.
BASE_MEASURES: tuple[str, ...] = (
    "goodput_rps",
    "slo_attainment",
    "ttft_mean_s",
    "ttft_p50_s",
    "ttft_p95_s",
    "ttft_p99_s",
    "ttft_over_bound",
    "tpot_mean_s",
    "tpot_p99_s",
    "throughput_tok_s",
    "hit_ratio",
    "busy_fraction",
    "hotspot_confirmed",
    "rejected",
    "tier_hit_ratio",
    "tier_gb",
    "tier_wait_s",
    "wall_s",
    "cpu_s",
)
# The SLO scaled by each factor (TTFT and TPOT together): goodput at every one, so that no
# single SLO decides a ranking.
SLO_SCALES = (0.5, 1.0, 2.0, 4.0)
SLO_KEYS = tuple(f"goodput_slo_x{f:g}" for f in SLO_SCALES)
MEASURES = (*BASE_MEASURES, *SLO_KEYS)


def summarize(result: SimResult, workload: Workload) -> dict[str, Any]:
    """metrics.summarize judged by the workload's SLO, with the report's flat extras."""
    summary = metrics.summarize(result, workload.slo)
    summary["hotspot_confirmed"] = result.hotspot_events.get("confirmed", 0)
    for factor, key in zip(SLO_SCALES, SLO_KEYS, strict=True):
        slo = metrics.Slo(workload.slo_ttft_s * factor, workload.slo_tpot_s * factor)
        summary[key] = metrics.goodput(result.requests, slo).rps
    if "tier" in summary:  # flat copies for the cell table
        tier = summary["tier"]
        summary.update(
            tier_hit_ratio=tier["hit_ratio"],
            tier_gb=tier["bytes_read"] / 1e9,
            tier_wait_s=tier["read_wait_s"],
        )
        del tier["per_instance"]  # 16 more objects per run in matrix.json, read by nobody
    return summary


def aggregate(policy: str, runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A policy's row in a cell: each measure's mean over the seeds at the top level (as a
    single run's summary has it) and its interval half-width under ``ci``; the runs, in
    replicate order, under ``runs``. A measure missing from any run is left out."""
    row: dict[str, Any] = {"policy": policy, "seeds": len(runs), "ci": {}}
    for key in MEASURES:
        values = [float(run[key]) for run in runs if run.get(key) is not None]
        if not values or len(values) < len(runs):
            continue
        estimate = stats.mean_ci(values)
        row[key] = estimate.mean
        row["ci"][key] = estimate.to_json()["ci"]
    row["runs"] = list(runs)
    return row


def series(row: Mapping[str, Any], key: str) -> np.ndarray | None:
    """A measure's per-seed values (None if any seed lacks it)."""
    values = [run.get(key) for run in row["runs"]]
    if any(v is None for v in values):
        return None
    return np.array(values, dtype=float)


def estimate(row: Mapping[str, Any], key: str) -> stats.Estimate | None:
    values = series(row, key)
    return None if values is None else stats.mean_ci(values)


# ----------------------------------------------------------------- judging

# What a policy is judged on against another, in order; the first that is not a tie
# decides (stats.verdict). Goodput first; then whether one of the two wrecked decode (mean
# TPOT over the invariant's ceiling × least_load's) and the other did not; then mean TTFT,
# then mean TPOT. (key, higher is better); "decode" has no key of its own.
ORDER: tuple[tuple[str, str, bool], ...] = (
    ("goodput", "goodput_rps", True),
    ("decode", "", False),
    ("TTFT", "ttft_mean_s", False),
    ("TPOT", "tpot_mean_s", False),
)
NO_DIFFERENCE = stats.Estimate(math.nan, math.inf, 0)


def _compare(
    a: Mapping[str, Any], b: Mapping[str, Any], key: str, higher: bool
) -> stats.Comparison:
    x, y = series(a, key), series(b, key)
    if x is None or y is None:  # nothing to measure (no completed request): no difference
        return stats.Comparison("tie", NO_DIFFERENCE, math.nan)
    return stats.compare(x, y, higher_is_better=higher)


def wrecks_decode(rows: Mapping[str, Mapping[str, Any]], name: str) -> bool:
    """Mean TPOT over the invariant's ceiling × least_load's (False without least_load)."""
    own = rows[name].get("tpot_mean_s")
    reference = rows["least_load"].get("tpot_mean_s") if "least_load" in rows else None
    if own is None or not reference:
        return False
    return bool(own > invariant.TPOT_CEILING * reference)


def _decode(rows: Mapping[str, Mapping[str, Any]], a: str, b: str) -> stats.Comparison:
    wrecked_a, wrecked_b = wrecks_decode(rows, a), wrecks_decode(rows, b)
    outcome: stats.Standing = (
        "tie" if wrecked_a == wrecked_b else "worse" if wrecked_a else "better"
    )
    return stats.Comparison(outcome, NO_DIFFERENCE, math.nan)


def best_of(rows: Mapping[str, Mapping[str, Any]], names: Iterable[str]) -> str | None:
    """The best of ``names`` in a cell: the highest mean goodput; among the policies tied
    with it (the tie rule), those that did not wreck decode (if any); of those, the lowest
    mean TTFT."""
    candidates = [n for n in names if n in rows and rows[n].get("goodput_rps") is not None]
    if not candidates:
        return None
    top = max(candidates, key=lambda n: rows[n]["goodput_rps"])
    tied = [
        n
        for n in candidates
        if n == top or _compare(rows[n], rows[top], "goodput_rps", True).outcome == "tie"
    ]
    tied = [n for n in tied if not wrecks_decode(rows, n)] or tied

    def order(name: str) -> tuple[float, float, str]:
        row = rows[name]
        return (row.get("ttft_mean_s") or math.inf, row.get("tpot_mean_s") or math.inf, name)

    return min(tied, key=order)


def compare_to_best(
    rows: Mapping[str, Mapping[str, Any]], policy: str, others: Iterable[str]
) -> dict[str, Any] | None:
    """``policy`` against the best of ``others`` in one cell, metric by metric in ORDER."""
    best = best_of(rows, [n for n in others if n != policy])
    if policy not in rows or best is None:
        return None
    comparisons = {
        name: _decode(rows, policy, best)
        if name == "decode"
        else _compare(rows[policy], rows[best], key, higher)
        for name, key, higher in ORDER
    }
    outcome, deciding = stats.verdict(comparisons)
    return {
        "against": best,
        "verdict": outcome,
        "on": deciding,
        "comparisons": {name: c.to_json() for name, c in comparisons.items()},
    }


def invariant_checks(rows: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Every registry policy's never-collapse check in one cell, seed by seed against the
    cell's baselines (``enginesim.replay.invariant``): worst ratios, every per-seed breach."""
    runs = {name: row["runs"] for name, row in rows.items() if name in POLICIES}
    baselines = [name for name in BASELINES if name in runs]
    return {
        policy: invariant.worst(invariant.check_seeds(policy, runs, baselines)) for policy in runs
    }


def analyse(data: dict[str, Any]) -> None:
    """Each cell's verdicts (every registry policy against the best other one; the
    ablations against the best baseline) and invariant checks, from its rows."""
    for cell in data["cells"].values():
        rows = {r["policy"]: r for r in cell["policies"]}
        cell["judgements"] = {
            policy: judged
            for policy in rows
            if (
                judged := compare_to_best(
                    rows, policy, POLICIES if policy in POLICIES else BASELINES
                )
            )
        }
        cell["invariant"] = invariant_checks(rows)


# ----------------------------------------------------------------- report

# (title, key, format, scale): mean ± interval for the first ones, then means only
INTERVAL_COLUMNS = (
    ("goodput r/s", "goodput_rps", ".3f", 1.0),
    ("SLO met", "slo_attainment", ".3f", 1.0),
    ("TTFT mean s", "ttft_mean_s", ".3f", 1.0),
    ("TTFT p99 s", "ttft_p99_s", ".2f", 1.0),
    ("TPOT mean ms", "tpot_mean_s", ".1f", 1000.0),
    ("TPOT p99 ms", "tpot_p99_s", ".0f", 1000.0),
    ("out tok/s", "throughput_tok_s", ".0f", 1.0),
)
MEAN_COLUMNS = (
    ("÷ bound", "ttft_over_bound", ".2f"),
    ("hit", "hit_ratio", ".3f"),
    ("busy", "busy_fraction", ".2f"),
    ("hotspots", "hotspot_confirmed", ".1f"),
    ("rejected", "rejected", ".0f"),
)
# cells whose cluster has a global KV tier add: prompt share loaded from it, GB read, and
# seconds the reads queued behind other instances' reads on their host's link
TIER_COLUMNS = (
    ("tier hit", "tier_hit_ratio", ".3f"),
    ("tier GB", "tier_gb", ".1f"),
    ("tier wait s", "tier_wait_s", ".2f"),
)


def _scaled(value: stats.Estimate | None, spec: str, scale: float) -> str:
    if value is None or not math.isfinite(value.mean):
        return "–"
    return stats.Estimate(value.mean * scale, value.half_width * scale, value.n).format(spec)


def _verdict_text(judged: Mapping[str, Any] | None) -> str:
    if judged is None:
        return "–"
    if judged["verdict"] == "tie":
        return f"tie (`{judged['against']}`)"
    outcome = "**behind**" if judged["verdict"] == "behind" else "ahead"
    return f"{outcome} on {judged['on']} (`{judged['against']}`)"


def cell_table(cell: Mapping[str, Any]) -> list[str]:
    rows = cell["policies"]
    lower = cell["lower_bound"]
    tier = TIER_COLUMNS if any("tier_hit_ratio" in r for r in rows) else ()
    means = (*MEAN_COLUMNS, *tier)
    titles = [c[0] for c in INTERVAL_COLUMNS] + [c[0] for c in means] + ["against the best"]
    lines = [
        "| policy | " + " | ".join(titles) + " |",
        "|---|" + "---:|" * (len(titles) - 1) + "---|",
    ]
    best = best_of({r["policy"]: r for r in rows}, POLICIES)
    for row in rows:
        values = [_scaled(estimate(row, key), spec, k) for _, key, spec, k in INTERVAL_COLUMNS]
        values += [
            "–" if row.get(key) is None else format(row[key], spec) for _, key, spec in means
        ]
        name = row["policy"]
        label = f"**`{name}`**" if name == best else f"`{name}`"
        verdict = "best" if name == best else _verdict_text(cell["judgements"].get(name))
        lines.append(f"| {label} | " + " | ".join([*values, verdict]) + " |")
    bound = ["–", "–", _fmt(lower.get("ttft_mean_s"), ".3f"), _fmt(lower.get("ttft_p99_s"), ".2f")]
    bound += ["–"] * (len(titles) - len(bound))
    bound[len(INTERVAL_COLUMNS) + 1] = _fmt(lower.get("hit_ratio"), ".3f")
    lines.append("| *lower bound* | " + " | ".join(bound) + " |")
    return lines


def _fmt(value: Any, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def _gap(comparison: Mapping[str, Any]) -> str:
    relative = comparison["relative"]
    text = "–" if relative is None else f"{relative:+.1%}"
    return f"{text} (tie)" if comparison["outcome"] == "tie" else text


# The measured metrics of ORDER as gap_table shows them: (name, key, format, scale).
GAP_COLUMNS = (
    ("goodput", "goodput_rps", ".3f", 1.0),
    ("TTFT", "ttft_mean_s", ".3f", 1.0),
    ("TPOT", "tpot_mean_s", ".1f", 1000.0),
)


def gap_table(cells: Mapping[str, Mapping[str, Any]], policy: str) -> list[str]:
    """Per cell: ``policy`` against the best other policy, goodput first."""
    lines = [
        f"| cell | best other | {policy} goodput r/s | best's | gap | {policy} TTFT s | "
        f"best's | gap | {policy} TPOT ms | best's | gap | verdict (decided on) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for key, cell in cells.items():
        judged = cell["judgements"].get(policy)
        if judged is None:
            continue
        rows = {r["policy"]: r for r in cell["policies"]}
        own, best = rows[policy], rows[judged["against"]]
        parts = [key, f"`{judged['against']}`"]
        for name, measure, spec, scale in GAP_COLUMNS:
            parts += [
                _scaled(estimate(own, measure), spec, scale),
                _scaled(estimate(best, measure), spec, scale),
                _gap(judged["comparisons"][name]),
            ]
        parts.append(_verdict_text(judged).replace(f" (`{judged['against']}`)", ""))
        lines.append("| " + " | ".join(parts) + " |")
    return lines


def tally(cells: Mapping[str, Mapping[str, Any]], policy: str) -> str:
    """One generated sentence: in how many cells ``policy`` is ahead, tied, behind."""
    verdicts = [c["judgements"][policy] for c in cells.values() if policy in c["judgements"]]
    if not verdicts:
        return f"`{policy}` ran in no cell with another policy."
    counts = {v: sum(j["verdict"] == v for j in verdicts) for v in ("ahead", "tie", "behind")}
    behind = [j["on"] for j in verdicts if j["verdict"] == "behind"]
    why = ", ".join(f"{behind.count(m)} on {m}" for m, *_ in ORDER if m in behind)
    return (
        f"`{policy}` against the best other policy: ahead in {counts['ahead']} of "
        f"{len(verdicts)} cells, tied in {counts['tie']}, behind in {counts['behind']}"
        + (f" ({why})." if why else ".")
    )


def scoreboard(cells: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Every registry policy's verdicts against the best other policy, over the matrix."""
    lines = [
        "| policy | cells | best | ahead | tie | behind | behind on goodput | on decode | "
        "on TTFT | on TPOT | invariant broken (cells) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for policy in POLICIES:
        verdicts = [c["judgements"][policy] for c in cells.values() if policy in c["judgements"]]
        if not verdicts:
            continue
        best = sum(
            best_of({r["policy"]: r for r in c["policies"]}, POLICIES) == policy
            for c in cells.values()
        )
        count = {v: sum(j["verdict"] == v for j in verdicts) for v in ("ahead", "tie", "behind")}
        on = [sum(j["verdict"] == "behind" and j["on"] == m for j in verdicts) for m, *_ in ORDER]
        broken = sum(bool(c["invariant"].get(policy, {}).get("breaches")) for c in cells.values())
        label = f"`{policy}`" + (" (ours)" if policy in invariant.OWN_POLICIES else "")
        lines.append(
            f"| {label} | {len(verdicts)} | {best} | {count['ahead']} | {count['tie']} | "
            f"{count['behind']} | " + " | ".join(map(str, on)) + f" | {broken} |"
        )
    return lines


def _best_at(rows: Mapping[str, Mapping[str, Any]], key: str) -> str:
    return max(rows, key=lambda policy: rows[policy].get(key) or 0.0)


def slo_scaling_section(cells: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Per cell, the policy with the best mean goodput at each SLO scale, and each of ours
    as a share of that best."""
    shown = [k for k, c in cells.items() if any(SLO_KEYS[0] in r for r in c["policies"])]
    if not shown:
        return []
    scales = " | ".join(f"×{f:g}" for f in SLO_SCALES)
    lines = [
        "## Goodput as the SLO scales",
        "",
        "The workload's TTFT and TPOT SLO multiplied together by each factor; per cell the "
        "policy with the best mean goodput at each scale, then each of ours as a share of "
        "that best (seed means). A ranking that holds at one scale only is the SLO's, not "
        "the policies'.",
        "",
        f"| cell | policy | {scales} |",
        "|---|---|" + "---:|" * len(SLO_SCALES),
    ]
    for key in shown:
        rows = {r["policy"]: r for r in cells[key]["policies"] if r["policy"] in POLICIES}
        best = [_best_at(rows, k) for k in SLO_KEYS]
        lines.append(f"| {key} | best | " + " | ".join(f"`{b}`" for b in best) + " |")
        for policy in (p for p in invariant.OWN_POLICIES if p in rows):
            shares = [
                _fmt((rows[policy].get(k) or 0.0) / top, ".2f")
                if (top := rows[b].get(k) or 0.0) > 0
                else "–"
                for k, b in zip(SLO_KEYS, best, strict=True)
            ]
            lines.append(f"| {key} | `{policy}` | " + " | ".join(shares) + " |")
    return lines


def invariant_section(cells: Mapping[str, Mapping[str, Any]]) -> list[str]:
    lines = [
        "## The never-collapse invariant",
        "",
        "A policy of ours may lose to the best by a little; it must never collapse "
        f"(`enginesim/replay/invariant.py`, v{invariant.VERSION}), {invariant.STATEMENT}. "
        "Every seed of every cell is checked; ratios are the worst over the seeds and "
        "every breaking seed is listed.",
        "",
    ]
    for policy in invariant.OWN_POLICIES:
        lines += [f"### `{policy}`", "", *_breach_table(cells, policy), ""]
    lines += [
        "### Where the baselines break it",
        "",
        "Baselines are not held to the invariant; this is where they would fail it.",
        "",
        "| baseline | cells breaking it | seeds breaking it | where |",
        "|---|---:|---:|---|",
    ]
    for policy in BASELINES:
        broken = {
            key: c["invariant"][policy]
            for key, c in cells.items()
            if c["invariant"].get(policy, {}).get("breaches")
        }
        seeds = sum(c["seeds_breaking"] for c in broken.values())
        where = "; ".join(f"{key} ({c['seeds_breaking']})" for key, c in broken.items()) or "–"
        lines.append(f"| `{policy}` | {len(broken)} | {seeds} | {where} |")
    return lines


def _breach_table(cells: Mapping[str, Mapping[str, Any]], policy: str) -> list[str]:
    checks = {k: c["invariant"][policy] for k, c in cells.items() if policy in c["invariant"]}
    broken = {k: c for k, c in checks.items() if c["breaches"]}
    if not checks:
        return ["Not checked: it ran in no cell."]
    seeds = sum(c["seeds"] for c in checks.values())
    failing = sum(c["seeds_breaking"] for c in checks.values())
    lines = [
        f"Holds on {seeds - failing} of {seeds} seeds, in {len(checks) - len(broken)} of "
        f"{len(checks)} cells on every seed."
    ]
    if broken:
        lines += [
            "",
            "| cell | worst goodput ÷ better reference | worst TTFT ÷ best baseline | "
            "worst TPOT ÷ best baseline | seeds | every breach |",
            "|---|---:|---:|---:|---:|---|",
        ]
        for key, c in broken.items():
            lines.append(
                f"| {key} | {_fmt(c['goodput_ratio'], '.3f')} | "
                f"{_fmt(c['ttft_ratio'], '.2f')} | {_fmt(c['tpot_ratio'], '.2f')} | "
                f"{c['seeds_breaking']}/{c['seeds']} | {'; '.join(c['breaches'])} |"
            )
    return lines


def variant_summary(cells: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Each LMetric variant over the matrix against the best baseline of each cell:
    geometric means of its goodput and mean-TTFT ratios, and its verdicts."""
    lines = [
        "| variant | cells | goodput ÷ best baseline's (geo. mean) | mean TTFT ÷ best "
        "baseline's (geo. mean) | ahead | tie | behind |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for variant in ["lmetric", *ABLATIONS, *TIER_ABLATIONS]:
        goodput, ttft, verdicts = [], [], []
        for cell in cells.values():
            rows = {r["policy"]: r for r in cell["policies"]}
            judged = compare_to_best(rows, variant, BASELINES)
            if judged is None:
                continue
            verdicts.append(judged["verdict"])
            own, best = rows[variant], rows[judged["against"]]
            if own.get("goodput_rps") and best.get("goodput_rps"):
                goodput.append(math.log(own["goodput_rps"] / best["goodput_rps"]))
            if own.get("ttft_mean_s") and best.get("ttft_mean_s"):
                ttft.append(math.log(own["ttft_mean_s"] / best["ttft_mean_s"]))
        if verdicts:
            lines.append(
                f"| `{variant}` | {len(verdicts)} | {_geo(goodput)} | {_geo(ttft)} | "
                f"{verdicts.count('ahead')} | {verdicts.count('tie')} | "
                f"{verdicts.count('behind')} |"
            )
    return lines


def _geo(logs: list[float]) -> str:
    return f"{math.exp(sum(logs) / len(logs)):.3f}" if logs else "–"


def heatmap(cells: Mapping[str, Mapping[str, Any]], path: Path) -> None:
    """Policy × cell, colour = mean goodput ÷ the best mean goodput in the cell."""
    import matplotlib.pyplot as plt

    keys = list(cells)
    names = [
        p
        for p in ALL_POLICIES
        if any(r["policy"] == p for c in cells.values() for r in c["policies"])
    ]
    grid = np.full((len(names), len(keys)), np.nan)
    for j, key in enumerate(keys):
        rows = [r for r in cells[key]["policies"] if r.get("goodput_rps") is not None]
        top = max((r["goodput_rps"] for r in rows), default=0.0)
        for row in rows:
            if top > 0:
                grid[names.index(row["policy"]), j] = row["goodput_rps"] / top
    fig, ax = plt.subplots(figsize=(1.0 + 0.55 * len(keys), 1.2 + 0.38 * len(names)))
    image = ax.imshow(grid, cmap="RdYlGn", vmin=0.5, vmax=1.0, aspect="auto")
    for (i, j), value in np.ndenumerate(grid):
        if np.isfinite(value):
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=6)
    ax.set_xticks(range(len(keys)), keys, rotation=60, ha="right", fontsize=7)
    ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.set_title(
        "goodput ÷ the cell's best (TTFT and TPOT SLO; mean over seeds; higher is better)",
        fontsize=9,
    )
    fig.colorbar(image, ax=ax, fraction=0.03)
    plots.save(fig, path)


def ttft_cdf(curves: Mapping[str, np.ndarray], bounds: np.ndarray, path: Path, title: str) -> None:
    """One TTFT CDF per policy over every seed's requests, the lower bound dashed."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, values, style in [
        *((name, v, "-") for name, v in curves.items()),
        ("lower bound", bounds, "--"),
    ]:
        values = np.sort(values[values > 0])
        if len(values):
            ax.plot(values, np.arange(1, len(values) + 1) / len(values), style, label=label)
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("fraction of requests (seeds pooled)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    plots.save(fig, path)


def report(out: Path, data: dict[str, Any]) -> None:
    """README.md from ``data`` alone: every figure and sentence in it comes from there."""
    cells = data["cells"]
    lines = [*header_lines(data), "", "## Which policy, per cell", ""]
    lines += [
        "Each registry policy against the best other policy of its cell (the verdict rule "
        "above); `best` counts the cells where it is that best policy itself.",
        "",
        *scoreboard(cells),
        "",
        "![heatmap](heatmap.png)",
        "",
    ]
    for policy in invariant.OWN_POLICIES:
        if any(policy in c["judgements"] for c in cells.values()):
            lines += [
                f"## `{policy}` against the best other policy, per cell",
                "",
                tally(cells, policy),
                "",
                *gap_table(cells, policy),
                "",
            ]
    lines += [*slo_scaling_section(cells), ""]
    lines += [*invariant_section(cells), ""]
    if any(r["policy"] in ABLATIONS for c in cells.values() for r in c["policies"]):
        lines += [
            "## LMetric's variants over the matrix",
            "",
            "Each against the best baseline of its cell ("
            + ", ".join(f"`{b}`" for b in BASELINES)
            + "; the verdict rule above).",
            "",
            *variant_summary(cells),
            "",
        ]
    for key, cell in cells.items():
        workload = WORKLOAD_BY_NAME[cell["workload"]]
        counts = cell["requests"]
        requests = (
            f"{min(counts)}" if min(counts) == max(counts) else f"{min(counts)}–{max(counts)}"
        )
        lines += [
            f"## {key}",
            "",
            f"{workload.source}; {requests} requests on "
            f"{BASE.instances}× {BASE.gpu.upper()} {cell['model']}, rate scale "
            f"{cell['rate_scale']:g} (target {cell['load']}% busy); SLO TTFT ≤ "
            f"{workload.slo_ttft_s:g} s and "
            f"TPOT ≤ {workload.slo_tpot_s * 1000:g} ms.",
            "",
            *cell_table(cell),
            "",
            f"![TTFT CDF]({cell['cdf']})",
            "",
        ]
    lines += [
        "The hotspot detector's sweep is a study of its own: "
        "[bench/hotspot](../hotspot/README.md) (`python -m bench.hotspot.run`).",
        "",
    ]
    (out / "README.md").write_text("\n".join(lines))


def header_lines(data: Mapping[str, Any]) -> list[str]:
    seeds = data["seeds"]
    policies = {r["policy"] for c in data["cells"].values() for r in c["policies"]}
    present = {c["workload"] for c in data["cells"].values()}
    models = " or ".join(sorted({c["model"] for c in data["cells"].values()}))
    flags = data.get("command", "")
    lines = [
        "# Evaluation matrix",
        "",
        f"Generated by `python -m bench.replay.run{' ' + flags if flags else ''}` on "
        f"{data['machine']}: {data['jobs']} simulations ({len(data['cells'])} cells × "
        f"{len(policies)} policies × {seeds} seeds) in {data['wall_s'] / 60:.1f} min (planned "
        f"{data['planned_s'] / 60:.1f} min). Every number and sentence below is generated "
        "from this run's `matrix.json`.",
        "",
        f"{BASE.instances}× {BASE.gpu.upper()} serving {models}, max_model_len "
        f"{BASE.max_model_len}, vLLM v1 defaults from enginesim; router block size "
        f"{BASE.router_block_size}, scrapes every {BASE.scrape_interval_s:g} s, no "
        "telemetry delay, shadow KV index (no KV "
        "events). Times are virtual seconds.",
        "",
        "How to read it:",
        "",
        f"* **Seeds.** Every cell runs {seeds} replicates: replicate i uses simulator "
        f"seed {BASE.seed}+i (the policies' tie-breaks) and, for the generated workloads "
        f"({', '.join(w.name for w in WORKLOADS if w.generated)}), generator seed "
        "`seed`+i (the workload table); a recorded trace is resampled (a window at a "
        f"seeded start where the trace is longer, arrivals re-timed within {RETIME_BIN_S:g} s "
        "bins), and every engine step carries seeded lognormal jitter (log-sd "
        f"{ENGINE_JITTER:g}). A value is the mean over seeds ± the half-width of its 95% "
        "Student-t confidence interval.",
        "* **Goodput** (the headline): requests per second of arrivals that meet the "
        "workload's TTFT *and* TPOT SLO; `SLO met` is their share of all requests "
        "(rejected ones miss). `out tok/s` is output tokens per second of makespan. "
        "`÷ bound` is the mean TTFT over the mean of the zero-queue, infinite-cache lower "
        "bound (each request prefilled alone on an idle engine that caches every earlier "
        "request's prompt). `hotspots` counts confirmed hotspot classes.",
        f"* **Ties**: {stats.rule_text()}",
        "* **Against the best.** A policy *wrecks decode* in a cell when its mean TPOT is "
        f"over {invariant.TPOT_CEILING:g}× `least_load`'s (the invariant's ceiling). A "
        "cell's best policy has the highest mean goodput; among the policies tied with "
        "it, those that do not wreck decode; of those, the lowest mean TTFT (bold in the "
        "cell tables). A policy is judged against the best *other* policy on goodput, "
        "then `decode` (one of the two wrecks it and the other does not), then mean "
        "TTFT, then mean TPOT: the first of these that is not a tie decides ahead or "
        "behind, and the verdict names it. So a policy that wins TTFT by wrecking "
        "decode is behind: on goodput when its requests miss the TPOT SLO, on `decode` "
        "when they do not.",
        "",
        "## Workloads",
        "",
        "| workload | source | SLO TTFT / TPOT | generator |",
        "|---|---|---|---|",
    ]
    for workload in (w for w in WORKLOADS if w.name in present):
        params = ", ".join(f"{k}={v}" for k, v in workload.params.items()) or "–"
        lines.append(
            f"| `{workload.name}` | {workload.source} | {workload.slo_ttft_s:g} s / "
            f"{workload.slo_tpot_s * 1000:g} ms | {params} |"
        )
    lines += [
        "",
        f"Calibration (`{CALIBRATION_POLICY}`, replicate 0, offered load = busy ÷ "
        "(instances × arrival span); fit busy = a·scale^k):",
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


# ----------------------------------------------------------------- plan


@dataclass
class MatrixPlan:
    cells: list[Cell]
    jobs: list[Job]
    fits: list[tuple[str, str]]  # (workload, model) pairs to calibrate
    limit: int | None
    seeds: int

    def estimate_s(self, workers: int) -> float:
        """Expected wall seconds: the runs' costs (RUN_COST_S, scaled by the share of the
        workload run) spread over the workers, after the calibration's two serial runs
        per workload and model, spread likewise."""

        def cost(workload: str) -> float:
            share = 1.0 if self.limit is None else min(1.0, self.limit / FULL_REQUESTS[workload])
            return RUN_COST_S[workload] * share

        calibration = sum(2 * cost(w) for w, _ in self.fits)
        runs = sum(cost(job.cell.workload) for job in self.jobs)
        return (calibration + runs) / max(1, workers)


# Requests in each whole workload (replicate 0), for the planner's share of a limit.
FULL_REQUESTS = {
    "conversation": 8940,
    "synthetic": 3993,
    "azure_code": 7491,
    "azure_conv": 5985,
    "agentic": 4327,
    "agentic_tier": 4327,
    "burst": 2811,
}


def plan(args: argparse.Namespace) -> MatrixPlan:
    workloads = args.workload or [w.name for w in WORKLOADS]
    loads = args.load or (QUICK_LOADS if args.quick else LOADS)
    cells = [Cell(w, MAIN_MODEL, load) for w in workloads for load in loads]
    if not args.load and not args.no_headline and not args.quick:
        cells += [Cell(w, HEADLINE_MODEL, HEADLINE_LOAD) for w in workloads]
    policies = args.policy or list(POLICIES)
    limit = QUICK_REQUESTS if args.quick else None
    fits = sorted({(c.workload, c.model) for c in cells})
    jobs = []
    for cell in cells:
        extra: list[str] = []
        if args.ablations and cell.model == MAIN_MODEL:
            extra = list(ABLATIONS)
            if WORKLOAD_BY_NAME[cell.workload].sim.get("global_tier_blocks"):
                extra += list(TIER_ABLATIONS)
        jobs += [
            Job(cell, policy, 0.0, limit, replicate)
            for replicate in range(args.seeds)
            for policy in [*policies, *extra]
        ]
    return MatrixPlan(cells, jobs, fits, limit, args.seeds)


# ----------------------------------------------------------------- main


def run(plan_: MatrixPlan, workers: int) -> tuple[dict[str, Any], list[Run], dict[Any, Any]]:
    """Calibrate, then run every job and every lower bound; returns the fits, the runs
    and the bounds."""
    with ProcessPoolExecutor(max_workers=workers) as pool:
        calibrations = [(w, m, plan_.limit) for w, m in plan_.fits]
        fits = {f"{w}@{m}": fit for w, m, fit in pool.map(_calibration_job, calibrations)}
        print("calibrated:", json.dumps(fits), flush=True)
        jobs = [
            replace(
                job, scale=scale_for(fits[f"{job.cell.workload}@{job.cell.model}"], job.cell.load)
            )
            for job in plan_.jobs
        ]
        replicates = {
            (w, m, plan_.limit, r if WORKLOAD_BY_NAME[w].generated else 0)
            for w, m in plan_.fits
            for r in range(plan_.seeds)
        }
        bounds = dict(pool.map(_bound_job, sorted(replicates)))
        runs = []
        for done in pool.map(_job, jobs):
            runs.append(done)
            print(
                f"[{len(runs)}/{len(jobs)}] {done.key:<28} {done.policy:<22} replicate "
                f"{done.replicate} goodput "
                f"{_fmt(done.summary['goodput_rps'], '.3f')} TTFT "
                f"{_fmt(done.summary['ttft_mean_s'], '.3f')} wall {done.summary['wall_s']:.1f}s "
                f"cpu {done.summary['cpu_s']:.1f}s",
                flush=True,
            )
    return fits, runs, bounds


def assemble(
    plan_: MatrixPlan,
    fits: Mapping[str, Any],
    runs: Sequence[Run],
    bounds: Mapping[Any, Any],
    out: Path,
) -> dict[str, Any]:
    """matrix.json's cells from the runs: rows with seed means, the lower bound, the CDF."""
    cells: dict[str, Any] = {}
    for cell in plan_.cells:
        workload = WORKLOAD_BY_NAME[cell.workload]
        mine = sorted((r for r in runs if r.key == cell.key), key=lambda r: r.replicate)
        lows = [
            bounds[(cell.workload, cell.model, r if workload.generated else 0)]
            for r in range(plan_.seeds)
        ]
        by_policy: dict[str, list[Run]] = {}
        for done in mine:
            summary = done.summary
            bound_mean = float(lows[done.replicate][1].mean())
            ttft = summary.get("ttft_mean_s")
            summary["ttft_over_bound"] = None if ttft is None else ttft / bound_mean
            by_policy.setdefault(done.policy, []).append(done)
        scale = scale_for(fits[f"{cell.workload}@{cell.model}"], cell.load)
        cdf = f"cdf_{cell.key.replace('/', '_').replace('@', '_')}.png"
        ttft_cdf(
            {p: np.concatenate([r.ttfts for r in rs]) for p, rs in by_policy.items()},
            np.concatenate([low[1] for low in lows]),
            out / cdf,
            f"{cell.key} (scale {scale:g}, {plan_.seeds} seeds)",
        )
        cells[cell.key] = {
            "workload": cell.workload,
            "model": cell.model,
            "load": cell.load,
            "rate_scale": scale,
            "requests": [low[0]["requests"] for low in lows],
            "cdf": cdf,
            "lower_bound": aggregate_bound([low[0] for low in lows]),
            "policies": [aggregate(p, [r.summary for r in rs]) for p, rs in by_policy.items()],
        }
    return cells


def aggregate_bound(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The lower bound's row: the mean over replicates of each of its numbers."""
    out: dict[str, Any] = {"policy": "lower_bound"}
    for key in ("ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "hit_ratio"):
        values = [float(r[key]) for r in rows if r.get(key) is not None]
        out[key] = float(np.mean(values)) if values and len(values) == len(rows) else None
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out",
        type=Path,
        help="default: bench/replay, or "
        "bench/out/replay with --quick (the committed report stays untouched)",
    )
    parser.add_argument("--quick", action="store_true", help="a reduced matrix in minutes")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes")
    parser.add_argument("--seeds", type=int, default=SEEDS, help="replicates per cell")
    parser.add_argument("--ablations", action="store_true", help="add LMetric's ablation rows")
    parser.add_argument("--workload", action="append", choices=list(WORKLOAD_BY_NAME))
    parser.add_argument("--load", action="append", type=int, help="target busy percent")
    parser.add_argument("--policy", action="append", choices=list(POLICIES))
    parser.add_argument(
        "--no-headline", action="store_true", help=f"skip the {HEADLINE_MODEL} cells"
    )
    parser.add_argument("--plan", action="store_true", help="print the plan and run nothing")
    parser.add_argument(
        "--assemble", action="store_true", help="run nothing: rebuild README.md from matrix.json"
    )
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.jobs < 1:
        parser.error("--seeds and --jobs must be at least 1")
    if args.out is None:
        here = Path(__file__).resolve().parent
        args.out = here.parent / "out" / "replay" if args.quick else here
    if args.assemble:
        data: dict[str, Any] = json.loads((args.out / "matrix.json").read_text())
        analyse(data)
        report(args.out, data)
        return 0
    plan_ = plan(args)
    planned = plan_.estimate_s(args.jobs)
    print(
        f"plan: {len(plan_.cells)} cells, {len(plan_.jobs)} runs ({args.seeds} seeds) and "
        f"{len(plan_.fits)} calibrations on {args.jobs} workers: about {planned / 60:.0f} min "
        "on an idle machine",
        flush=True,
    )
    if args.plan:
        return 0
    started = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    fits, runs, bounds = run(plan_, args.jobs)
    data = {
        "command": " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine(),
        "seeds": args.seeds,
        "jobs": len(runs),
        "planned_s": planned,
        "tie_rule": {"confidence": stats.CONFIDENCE, "tolerance": stats.TIE_TOLERANCE},
        "calibration": fits,
        "cells": assemble(plan_, fits, runs, bounds, args.out),
    }
    analyse(data)
    data["wall_s"] = time.perf_counter() - started
    (args.out / "matrix.json").write_text(json.dumps(data, indent=1, default=float) + "\n")
    heatmap(data["cells"], args.out / "heatmap.png")
    report(args.out, data)
    print(
        f"wrote {args.out}/README.md in {data['wall_s'] / 60:.1f} min (planned {planned / 60:.1f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
