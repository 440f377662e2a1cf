"""Prefill/decode disaggregation, replayed: colocated against split fleets and the decider.

    .venv/bin/python -m bench.disaggregation.run [--requests 800] [--seeds 3] [--jobs 2]

Fleet: 16 × H20 serving Qwen2-7B (the evaluation matrix's), RDMA link between instances,
the router's lmetric policy for colocated requests and prefill attempts, decode_room for
decode attempts. At equal GPU count:

* ``colocated``: 16 instances of role both, no split (today's cluster);
* ``4P+12D`` and ``8P+8D``: prefill and decode pools, every request split (``always``);
* ``llm-d``: 4 prefill + 12 both, split when the uncached prompt exceeds 256 tokens
  (llm-d's fixed prefix threshold);
* ``decider``: 4 prefill + 12 both, the cost decider (router_worker.routing.disagg).

Workloads: the Mooncake conversation trace (its first ``--requests`` requests; seeds vary
the engines' step jitter) and a generated prefill-heavy one (Poisson arrivals, prompts
lognormal around 8k tokens, answers around 600 tokens; seeds resample it), each at two
loads (arrival rate × ``RATES``). Goodput: requests meeting TTFT ≤ 5 s and TPOT ≤ 0.1 s,
per second of arrivals; means over seeds with a 95% interval (t-based). Bytes: KV read by
decode instances. Replay only: the live leg (a live stack against the replay) is not run
here.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from bench.lib.matrix import CONVERSATION
from enginesim.engine import FleetVariation
from enginesim.replay import metrics
from enginesim.replay.simulator import SimConfig, Simulator
from enginesim.replay.traces import TraceRecord, load_trace

HERE = Path(__file__).resolve().parent
TRACE = CONVERSATION
LONG = 131072
SLO = metrics.Slo(ttft_s=5.0, tpot_s=0.1)
RATES = {"mooncake": (1.0, 2.0), "prefill_heavy": (6.0, 10.0)}  # scale / requests per s
P4 = ("prefill",) * 4
FLEETS: dict[str, tuple[tuple[str, ...], str]] = {
    "colocated": ((), "never"),
    "4P+12D": (P4 + ("decode",) * 12, "always"),
    "8P+8D": (("prefill",) * 8 + ("decode",) * 8, "always"),
    "llm-d": (P4 + ("both",) * 12, "prefix_threshold"),
    "decider": (P4 + ("both",) * 12, "cost"),
    "llm-d 16B": (("both",) * 16, "prefix_threshold"),
    "decider 16B": (("both",) * 16, "cost"),
}


def prefill_heavy(seed: int, count: int, rate: float) -> list[TraceRecord]:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, count))
    prompts = np.clip(rng.lognormal(math.log(8000), 0.5, count), 512, 32000).astype(int)
    outputs = np.clip(rng.lognormal(math.log(600), 0.4, count), 32, 4000).astype(int)
    return [
        TraceRecord(k, float(arrivals[k]), int(prompts[k]), int(outputs[k])) for k in range(count)
    ]


def records_for(workload: str, load: float, seed: int, count: int) -> list[TraceRecord]:
    if workload == "mooncake":
        return load_trace(TRACE, max_requests=count, rate_scale=load)
    return prefill_heavy(seed, count, load)


def run_cell(cell: tuple[str, str, float, int, int]) -> dict[str, Any]:
    workload, fleet, load, seed, count = cell
    roles, decider = FLEETS[fleet]
    config = SimConfig(
        instances=16,
        max_model_len=LONG,
        seed=seed,
        roles=roles,
        decider={"kind": decider},
        variation=FleetVariation(step_jitter=0.05, seed=seed),
    )
    result = Simulator(records_for(workload, load, seed, count), "lmetric", config).run()
    summary = metrics.summarize(result, SLO)
    disagg = summary.get("disaggregation") or {}
    return {
        "workload": workload,
        "fleet": fleet,
        "load": load,
        "seed": seed,
        "goodput_rps": summary["goodput_rps"],
        "attainment": summary["slo_attainment"],
        "ttft_mean_s": summary["ttft_mean_s"],
        "tpot_mean_s": summary["tpot_mean_s"],
        "tpot_p99_s": summary["tpot_p99_s"],
        "split_ratio": disagg.get("split_ratio", 0.0),
        "gb_moved": disagg.get("transfer_bytes", 0) / 1e9,
    }


def _ci(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% interval (t, n − 1 degrees of freedom)."""
    t95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57}
    mean = float(np.mean(values))
    if len(values) < 2:
        return mean, float("nan")
    return mean, t95.get(len(values) - 1, 2.0) * float(np.std(values, ddof=1)) / math.sqrt(
        len(values)
    )


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| workload | load | fleet | goodput (req/s) | attainment | TTFT mean (s) | "
        "TPOT mean (ms) | TPOT p99 (ms) | split | GB moved |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    keys = sorted({(r["workload"], r["load"]) for r in rows})
    for workload, load in keys:
        for fleet in FLEETS:
            cell = [
                r for r in rows if (r["workload"], r["load"], r["fleet"]) == (workload, load, fleet)
            ]
            if not cell:
                continue
            good, half = _ci([r["goodput_rps"] for r in cell])
            mean = {
                k: float(np.mean([r[k] for r in cell]))
                for k in cell[0]
                if k not in ("workload", "fleet")
            }
            lines.append(
                f"| {workload} | {load:g} | {fleet} | {good:.3f} ± {half:.3f} | "
                f"{mean['attainment']:.3f} | {mean['ttft_mean_s']:.2f} | "
                f"{1000 * mean['tpot_mean_s']:.1f} | {1000 * mean['tpot_p99_s']:.1f} | "
                f"{mean['split_ratio']:.2f} | {mean['gb_moved']:.0f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=800)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args(argv)
    cells = [
        (workload, fleet, load, seed, args.requests)
        for workload, loads in RATES.items()
        for load in loads
        for fleet in FLEETS
        for seed in range(args.seeds)
    ]
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(run_cell, cells))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(rows, indent=1))
    machine = f"{platform.machine()}, Python {sys.version.split()[0]}"
    report = (
        f"Replay, 16 × H20 Qwen2-7B, {args.requests} requests a cell, {args.seeds} seeds "
        f"(goodput ± 95% interval), SLO TTFT ≤ {SLO.ttft_s:g} s and TPOT ≤ "
        f"{1000 * SLO.tpot_s:g} ms; {machine}.\n\n{table(rows)}\n"
    )
    (args.out / "table.md").write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
