"""Grey-failure detection on real traces: false alarms and TTFT with the detector off and on.

    .venv/bin/python -m bench.grey.run [--jobs 2] [--fault] [--expectation decode_only]

Each cell replays the first ``--max-requests`` (1,500) requests of a trace from the
shared traces beside the checkout (``bench.lib.matrix.TRACE_DIR``, or ``--traces-dir``)
on 8 × H20 serving Qwen2-7B at a rate scale
(0.7× and 2×) under one policy, twice: detector off (``grey=None``, as ``enginesim replay
--no-grey``) and on (``GreyParams(enabled=True)``, the routers' settings). ``--fault``
fails instance 0 at 60 s and restores it at 120 s (the scenario of docs/algorithms.md,
"Grey failures"). ``--slow 3`` slows instance 3 that many times from ``--slow-at`` to the end
(a grey failure to catch: when it was degraded and drained, its share of the requests
arriving from 60 s after the slowdown on). ``--expectation decode_only`` sets the
detector's prefill coefficients to 0: the expectation before the prefill work was counted
(a decode step only).

Per cell: the detector's transitions by the state entered (suspect, degraded, drained), and
TTFT mean and p99 off and on. The replay is deterministic and in simulated time: the numbers
do not depend on the machine. Writes ``--out`` (JSON, one object per cell) and prints a
Markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from bench.lib.matrix import TRACE_DIR
from enginesim.replay import metrics
from enginesim.replay.simulator import Fault, SimConfig, Simulator
from enginesim.replay.traces import load_trace
from router_worker.routing.grey import GreyParams, GreyState

TRACES = {
    "azure_code": "AzureLLMInferenceTrace_code.csv",
    "mooncake_conv": "mooncake_conversation_t0-2700s.jsonl",
}
POLICIES = ("round_robin", "lmetric", "smetric", "predicted_ttft")
RATES = (0.7, 2.0)
FAULT = (Fault(60.0, 0, "fail"), Fault(120.0, 0, "restore"))
SLOW_SLOT = 3


def grey_params(expectation: str) -> GreyParams:
    if expectation == "decode_only":
        return GreyParams(enabled=True, prefill_token_s=0.0, attention_pair_s=0.0)
    return GreyParams(enabled=True)


def run_cell(cell: dict[str, Any]) -> dict[str, Any]:
    records = load_trace(cell["path"], rate_scale=cell["rate"], max_requests=cell["max_requests"])
    keys = ("trace", "rate", "policy", "fault", "slow", "slow_at")
    row: dict[str, Any] = {k: cell[k] for k in keys}
    faults: tuple[Fault, ...] = FAULT if cell["fault"] else ()
    if cell["slow"]:
        faults += (Fault(cell["slow_at"], SLOW_SLOT, "slow", cell["slow"]),)
    for label, grey in (("off", None), ("on", grey_params(cell["expectation"]))):
        config = SimConfig(instances=cell["instances"], faults=faults, grey=grey)
        result = Simulator(records, cell["policy"], config).run()
        summary = metrics.summarize(result)
        row[f"ttft_mean_{label}"] = summary["ttft_mean_s"]
        row[f"ttft_p99_{label}"] = summary["ttft_p99_s"]
        row[f"completed_{label}"] = summary["completed"]
        if cell["slow"]:
            after = [r for r in result.requests if r.arrival_s >= cell["slow_at"] + 60]
            mine = sum(r.instance == f"i{SLOW_SLOT}" for r in after)
            row[f"share_after_{label}"] = mine / max(1, len(after))
        if grey is not None:
            count = {state.value: 0 for state in GreyState}
            for change in result.grey_log:
                count[change.after.value] += 1
            row.update(count)
            row["flagged"] = sorted(
                {c.instance for c in result.grey_log if c.after is not GreyState.HEALTHY}
            )
            slowed = [c for c in result.grey_log if c.instance == f"i{SLOW_SLOT}"]
            for state in (GreyState.DEGRADED, GreyState.DRAINED):
                at = next((c.at for c in slowed if c.after is state), None)
                row[f"{state.value}_after_s"] = None if at is None else at - cell["slow_at"]
    return row


def slow_table(rows: Sequence[dict[str, Any]]) -> str:
    head = (
        "| trace | rate | policy | slowed | degraded after (s) | drained after (s) | "
        "flagged | its share after off → on | TTFT mean off → on (s) | TTFT p99 off → on (s) |"
    )
    lines = [head, "|---|---:|---|---:|---:|---:|---|---:|---:|---:|"]
    for r in rows:
        times = [r[f"{s}_after_s"] for s in ("degraded", "drained")]
        cells = ["-" if t is None else f"{t:.1f}" for t in times]
        lines.append(
            f"| {r['trace']} | {r['rate']:g}× | {r['policy']} | {r['slow']:g}× at "
            f"{r['slow_at']:g} s | {cells[0]} | "
            f"{cells[1]} | {', '.join(r['flagged']) or '-'} | "
            f"{r['share_after_off']:.3f} → {r['share_after_on']:.3f} | "
            f"{r['ttft_mean_off']:.3f} → {r['ttft_mean_on']:.3f} | "
            f"{r['ttft_p99_off']:.2f} → {r['ttft_p99_on']:.2f} |"
        )
    return "\n".join(lines)


def table(rows: Sequence[dict[str, Any]]) -> str:
    head = (
        "| trace | rate | policy | fault | suspect | degraded | drained | "
        "TTFT mean off → on (s) | TTFT p99 off → on (s) |"
    )
    lines = [head, "|---|---:|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['trace']} | {r['rate']:g}× | {r['policy']} | "
            f"{'fail 60-120 s' if r['fault'] else 'none'} | {r['suspect']} | {r['degraded']} | "
            f"{r['drained']} | {r['ttft_mean_off']:.3f} → {r['ttft_mean_on']:.3f} | "
            f"{r['ttft_p99_off']:.2f} → {r['ttft_p99_on']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--traces-dir", type=Path, default=TRACE_DIR)
    parser.add_argument("--trace", action="append", choices=sorted(TRACES), default=[])
    parser.add_argument("--policy", action="append", default=[])
    parser.add_argument("--rate", action="append", type=float, default=[])
    parser.add_argument("--fault", action="store_true", help="fail i0 at 60 s, restore at 120 s")
    parser.add_argument(
        "--slow",
        type=float,
        default=0.0,
        help=f"slow i{SLOW_SLOT} this many times",
    )
    parser.add_argument("--slow-at", type=float, default=300.0, help="from then, s")
    parser.add_argument("--expectation", choices=("prefill", "decode_only"), default="prefill")
    parser.add_argument("--instances", type=int, default=8)
    parser.add_argument("--max-requests", type=int, default=1500)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    cells = [
        {
            "trace": trace,
            "path": str(args.traces_dir / TRACES[trace]),
            "rate": rate,
            "policy": policy,
            "fault": args.fault,
            "slow": args.slow,
            "slow_at": args.slow_at,
            "expectation": args.expectation,
            "instances": args.instances,
            "max_requests": args.max_requests,
        }
        for trace in args.trace or sorted(TRACES)
        for rate in args.rate or RATES
        for policy in args.policy or POLICIES
    ]
    rows = []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for row in pool.map(run_cell, cells):
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)
    print(slow_table(rows) if args.slow else table(rows))
    if args.out is not None:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
