"""SMetric's own experiment: goodput of agentic sessions against offered rate.

    .venv/bin/python -m bench.smetric.run [--jobs 2] [--out bench/smetric]

Workload: the evaluation matrix's ``agentic`` sessions (enginesim ``agentic_sessions``: 640 agent
sessions, 8 shared system prompts; every record carries its session id and turn, which
reach the router as the request's turn index), replayed on the same 16× H20 Qwen2-7B
cluster as the evaluation matrix, at a sweep of rate scales (arrival times ÷ scale, so
sessions start and turns follow each other ``scale`` × faster).

Policies: smetric, lmetric, cache_aware, least_load, each without and with a global KV
tier. The tier (SimConfig ``global_tier_blocks`` at the default PCIe-class 25 GB/s) holds
:data:`TIER_BYTES` = 1 TiB of KV, a CPU-DRAM pool of the kind SMetric's paper provisions:
more than the workload's whole set of distinct blocks (printed in the report), so the tier
never evicts and what it changes is only the cost of a local miss — a migrated session
loads its history instead of recomputing it. A tier smaller than the working set would mix
that effect with the tier's own LRU.

Goodput: requests whose TTFT meets the workload's TTFT SLO as the evaluation matrix defines it for
``agentic`` (2 s; TPOT is not counted: the router's decision steers TTFT, and the TPOT
column of the evaluation matrix is met by every policy here) per second of arrival span.
Peak rate under SLO: the highest offered rate (requests/s) at which at least
:data:`ATTAINMENT` of the requests meet it, interpolated linearly between the two swept
rates around the crossing (``>`` the top rate when it never drops below).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from bench.lib.matrix import BASE, WORKLOAD_BY_NAME, machine
from enginesim.engine.models import MODELS
from enginesim.replay import metrics, plots
from enginesim.replay.simulator import Simulator
from enginesim.replay.traces import select

POLICIES = ("smetric", "lmetric", "cache_aware", "least_load")
SCALES = (1.0, 2.0, 4.0, 6.0, 7.0, 8.0, 10.0)
TIER_BYTES = 1 << 40  # 1 TiB of CPU DRAM shared by the 16 instances
ATTAINMENT = 0.9
WORKLOAD = WORKLOAD_BY_NAME["agentic"]
ENGINE_BLOCK = 16  # enginesim's KV block size (EngineConfig.block_size)


def tier_blocks(model: str = BASE.model) -> int:
    return TIER_BYTES // (ENGINE_BLOCK * MODELS[model].kv_bytes_per_token())


def _run(args: tuple[str, bool, float]) -> dict[str, Any]:
    policy, tier, scale = args
    records = select(WORKLOAD.build(None), rate_scale=scale)
    config = replace(BASE, global_tier_blocks=tier_blocks() if tier else 0)
    started = time.perf_counter()
    result = Simulator(records, policy, config).run()
    done = [r for r in result.requests if r.status == "ok"]
    ttft = metrics.ttfts(done)
    met = int(np.sum(ttft <= WORKLOAD.slo_ttft_s))
    arrivals = [r.arrival_s for r in records]
    span = max(arrivals) - min(arrivals)
    summary = metrics.summarize(result)
    return {
        "policy": policy,
        "tier": tier,
        "scale": scale,
        "requests": len(records),
        "offered_rps": len(records) / span,
        "met": met,
        "attainment": met / len(records),
        "goodput_rps": met / span,
        "ttft_mean_s": summary["ttft_mean_s"],
        "ttft_p99_s": summary["ttft_p99_s"],
        "hit_ratio": summary["hit_ratio"],
        "slo_both": metrics.slo_met(done, WORKLOAD.slo_ttft_s, WORKLOAD.slo_tpot_s) / len(records),
        "decisions": dict(result.decision_reasons),
        "wall_s": time.perf_counter() - started,
    }


def peak_rate(rows: Sequence[dict[str, Any]]) -> tuple[float, bool]:
    """Highest offered rate with attainment ≥ ATTAINMENT (interpolated), and whether it is
    only a lower bound (attainment never fell below the threshold)."""
    rows = sorted(rows, key=lambda r: r["offered_rps"])
    if rows[0]["attainment"] < ATTAINMENT:
        return 0.0, False
    for low, high in pairwise(rows):
        if high["attainment"] < ATTAINMENT:
            share = (low["attainment"] - ATTAINMENT) / (low["attainment"] - high["attainment"])
            return low["offered_rps"] + share * (high["offered_rps"] - low["offered_rps"]), False
    return rows[-1]["offered_rps"], True


def distinct_blocks() -> int:
    return len({h for r in WORKLOAD.build(None) for h in r.block_ids})


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for colour, policy in enumerate(POLICIES):
        for tier, style in ((False, "-"), (True, "--")):
            mine = sorted(
                (r for r in rows if r["policy"] == policy and r["tier"] == tier),
                key=lambda r: r["offered_rps"],
            )
            label = f"{policy}{' + tier' if tier else ''}"
            x = [r["offered_rps"] for r in mine]
            for ax, key in ((left, "goodput_rps"), (right, "attainment")):
                ax.plot(
                    x,
                    [r[key] for r in mine],
                    style,
                    color=f"C{colour}",
                    marker="o",
                    markersize=3,
                    label=label,
                )
    top = max(r["offered_rps"] for r in rows)
    left.plot([0, top], [0, top], ":", color="grey", linewidth=0.8, label="all meet the SLO")
    left.set_xlabel("offered rate (requests/s)")
    left.set_ylabel(f"goodput (requests/s with TTFT ≤ {WORKLOAD.slo_ttft_s:g} s)")
    right.axhline(ATTAINMENT, color="grey", linewidth=0.8, linestyle=":")
    right.set_xlabel("offered rate (requests/s)")
    right.set_ylabel("fraction meeting the TTFT SLO")
    for ax in (left, right):
        ax.grid(True, alpha=0.3)
    right.legend(fontsize=7)
    fig.suptitle("agentic sessions, 16× H20 Qwen2-7B: goodput against offered rate", fontsize=9)
    plots.save(fig, path)


def report(out: Path, data: dict[str, Any]) -> None:
    rows, peaks = data["rows"], data["peaks"]
    scales = sorted({r["scale"] for r in rows})
    lines = [
        "# SMetric: goodput of agentic sessions against offered rate",
        "",
        f"Generated by `python -m bench.smetric.run` on {data['machine']} in "
        f"{data['wall_s'] / 60:.1f} min. Workload: the evaluation matrix's `agentic` sessions "
        f"({data['requests']} requests in 640 sessions, turn index known to the router), "
        f"16× H20 Qwen2-7B, seed {BASE.seed}, virtual time. Global tier: "
        f"{TIER_BYTES / 2**40:g} TiB = {data['tier_blocks']:,} blocks of 16 tokens at "
        f"{BASE.global_tier_bandwidth / 1e9:g} GB/s; the workload has "
        f"{data['distinct_blocks']:,} distinct blocks, so the tier holds all of them and "
        "never evicts (see the script's docstring for why). Goodput = requests with TTFT ≤ "
        f"{WORKLOAD.slo_ttft_s:g} s (the matrix's agentic TTFT SLO) per second of arrival "
        f"span; peak rate = highest offered rate at which ≥ {ATTAINMENT:.0%} of requests meet "
        "it, interpolated between swept rates.",
        "",
        "## Peak rate under the SLO",
        "",
        "| policy | no tier (req/s) | with tier (req/s) |",
        "|---|---:|---:|",
    ]
    for policy in POLICIES:
        cells = []
        for tier in (False, True):
            rate, lower = peaks[f"{policy}{'+tier' if tier else ''}"]
            low = min(r["offered_rps"] for r in rows)
            cells.append(f"< {low:.2f}" if rate == 0 else f"{'> ' if lower else ''}{rate:.2f}")
        lines.append(f"| `{policy}` | " + " | ".join(cells) + " |")
    lines += [
        "",
        "![goodput](goodput.png)",
        "",
        "## Goodput (req/s) and attainment per rate",
        "",
        "| policy | tier | "
        + " | ".join(f"scale {s:g} ({_offered(rows, s):.2f} r/s)" for s in scales)
        + " |",
        "|---|---|" + "---:|" * len(scales),
    ]
    for policy in POLICIES:
        for tier in (False, True):
            mine = {r["scale"]: r for r in rows if r["policy"] == policy and r["tier"] == tier}
            cells = [
                f"{mine[s]['goodput_rps']:.2f} ({mine[s]['attainment']:.1%}, "
                f"{mine[s]['ttft_mean_s']:.2f} s)"
                for s in scales
            ]
            lines.append(f"| `{policy}` | {'on' if tier else 'off'} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Each cell: goodput (share meeting the TTFT SLO, mean TTFT). Every number, "
        "with hit ratios and decision counts, is in results.json.",
        "",
    ]
    lines += observations(data)
    (out / "README.md").write_text("\n".join(lines) + "\n")


def _rows(rows: list[dict[str, Any]], policy: str, tier: bool) -> dict[float, dict[str, Any]]:
    return {r["scale"]: r for r in rows if r["policy"] == policy and r["tier"] == tier}


def _peak(data: dict[str, Any], name: str) -> str:
    rate, lower = data["peaks"][name]
    low = min(r["offered_rps"] for r in data["rows"])
    return f"under {low:.1f}" if rate == 0 else f"{'over ' if lower else ''}{rate:.1f}"


def observations(data: dict[str, Any]) -> list[str]:
    """The reading of the tables above, every number in it taken from ``data``."""
    rows, threshold = data["rows"], data["attainment_threshold"]
    scales = sorted({r["scale"] for r in rows})
    sm, lm = _rows(rows, "smetric", False), _rows(rows, "lmetric", False)
    both_meet = [s for s in scales if min(sm[s]["attainment"], lm[s]["attainment"]) >= threshold]
    gap = max((abs(sm[s]["goodput_rps"] / lm[s]["goodput_rps"] - 1) for s in both_meet), default=0)
    past = [s for s in scales if s not in both_meet][:2]
    lowest = _rows(rows, "least_load", False)[scales[0]]
    lines = [
        "## Observations",
        "",
        f"* **Without a tier**: peak rate under the SLO {_peak(data, 'smetric')} req/s for "
        f"SMetric against {_peak(data, 'lmetric')} for LMetric"
        + (
            f" (goodput within {gap:.0%} of each other up to {both_meet[-1]:g}×)"
            if both_meet
            else ""
        )
        + f", {_peak(data, 'cache_aware')} for cache_aware and {_peak(data, 'least_load')} "
        f"for least_load, which misses the SLO for {1 - lowest['attainment']:.0%} of requests "
        f"already at the lowest rate ({lowest['offered_rps']:.1f} req/s): every follow-up "
        "recomputes its history."
        + (
            " Past the peak ("
            + " and ".join(f"{s:g}×" for s in past)
            + ") SMetric holds "
            + " and ".join(f"{sm[s]['attainment']:.0%}" for s in past)
            + " of requests to the SLO, LMetric "
            + " and ".join(f"{lm[s]['attainment']:.0%}" for s in past)
            + "."
            if past
            else ""
        ),
    ]
    held = []
    for policy in POLICIES:
        mine = _rows(rows, policy, True)
        _, lower = data["peaks"][f"{policy}+tier"]
        if lower:
            held.append(
                f"{policy} holds it at every rate swept (≥ "
                f"{_floor_percent(min(r['attainment'] for r in mine.values()))} up to "
                f"{max(r['offered_rps'] for r in mine.values()):.1f} req/s, mean TTFT ≤ "
                f"{max(r['ttft_mean_s'] for r in mine.values()):.2f} s)"
            )
        else:
            held.append(f"{policy} falls under {threshold:.0%} at {_peak(data, policy + '+tier')}")
    history = 10_000 * MODELS[BASE.model].kv_bytes_per_token()
    lines += [
        f"* **With the tier**: {'; '.join(held)}. The tier here never evicts (it holds every "
        f"distinct block) and sits behind a {BASE.global_tier_bandwidth / 1e9:g} GB/s link "
        f"(reads queue behind each other, `GlobalKVTier`): a 10k-token history is "
        f"{history / 1e9:.2f} GB, {history / BASE.global_tier_bandwidth * 1000:.0f} ms on the "
        "link. SMetric's rule with a tier (`tier_rebalance`): a follow-up goes to the "
        "instance where it starts first, its history loading from the tier at "
        "`tier_token_cost` of a recompute; LMetric charges tier-held tokens the same inside "
        "its product.",
    ]
    ll_tier, ll = data["peaks"]["least_load+tier"], data["peaks"]["least_load"]
    if ll_tier[1] and data["peaks"]["smetric+tier"][1] and ll[0] == 0:
        lines.append(
            "* **least_load with the tier does as well as SMetric**: with a tier this large and "
            "a link this fast a miss costs little against its recompute, so pure balance is "
            "enough; without a tier least_load is the worst policy here, and SMetric does not "
            "give that case up."
        )
    return [*lines, ""]


def _floor_percent(share: float) -> str:
    """A share as a percentage rounded down (99.98% is not yet 100.0%)."""
    return f"{math.floor(share * 1000) / 10:.1f}%"


def _offered(rows: list[dict[str, Any]], scale: float) -> float:
    return next(r["offered_rps"] for r in rows if r["scale"] == scale)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (at most 2)")
    parser.add_argument(
        "--scale",
        type=float,
        action="append",
        help=f"rate scales to sweep (default {', '.join(map(str, SCALES))})",
    )
    parser.add_argument(
        "--assemble",
        action="store_true",
        help="run nothing: rebuild README.md and goodput.png from results.json",
    )
    args = parser.parse_args(argv)
    if args.assemble:
        data = json.loads((args.out / "results.json").read_text())
        plot(data["rows"], args.out / "goodput.png")
        report(args.out, data)
        return 0
    if not 1 <= args.jobs <= 2:
        parser.error("--jobs must be 1 or 2 (the machine is shared)")
    scales = args.scale or list(SCALES)
    started = time.perf_counter()
    jobs = [(p, t, s) for s in scales for t in (False, True) for p in POLICIES]
    rows = []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for row in pool.map(_run, jobs):
            rows.append(row)
            print(
                f"{row['policy']:<12} tier={row['tier']!s:<5} scale={row['scale']:<4g} "
                f"{row['offered_rps']:.2f} r/s attainment {row['attainment']:.3f} "
                f"mean {row['ttft_mean_s']:.3f} s wall {row['wall_s']:.0f}s",
                flush=True,
            )
    peaks = {}
    for policy in POLICIES:
        for tier in (False, True):
            peaks[f"{policy}{'+tier' if tier else ''}"] = peak_rate(
                [r for r in rows if r["policy"] == policy and r["tier"] == tier]
            )
    data = {
        "machine": machine(),
        "requests": rows[0]["requests"],
        "tier_blocks": tier_blocks(),
        "tier_bytes": TIER_BYTES,
        "distinct_blocks": distinct_blocks(),
        "attainment_threshold": ATTAINMENT,
        "slo_ttft_s": WORKLOAD.slo_ttft_s,
        "peaks": peaks,
        "rows": rows,
        "wall_s": time.perf_counter() - started,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(data, indent=1) + "\n")
    plot(rows, args.out / "goodput.png")
    report(args.out, data)
    print(f"wrote {args.out}/README.md in {data['wall_s'] / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
