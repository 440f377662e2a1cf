"""Prefill/decode disaggregation, live against replay: one small disaggregated cluster.

    .venv/bin/python -m bench.disaggregation.live [--time-scale 2] [--end 30]

A devharness.Fleet of enginesim instances with roles (default 2 prefill + 2 decode, H20 /
Qwen2-7B, slow motion ``--time-scale``) behind a standalone router that splits every
request (decider ``always``), driven by enginesim's load generator with a slice of the
Mooncake conversation trace; then the replay simulator runs the same slice, cluster, roles
and decider in virtual time. Compares mean TTFT and TPOT (client-side, divided by the
time scale) with the replay's: the issue's third goal asks for agreement within 10%.
Writes ``live.md`` beside this file.

The conversation trace's timestamps are whole multiples of 3 s: about ten requests arrive
at one instant. Live they reach the two prefill engines in the order the router finishes
reading them (a 100 KB prompt last), so short prompts go first; the replay takes them in
trace order. On two prefill instances that alone moved the mean TTFT by ~20%. So both
sides run the same slice re-timed (``--retime-seed``; ``enginesim.replay.traces.retime``
over the trace's own 3 s bins): each group's requests at distinct uniform times within
its bin, in trace order; ``--retime-seed -1`` keeps the trace's instants.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from bench.lib import live as stack
from bench.lib.matrix import CONVERSATION, machine
from devharness import Fleet
from enginesim.replay.simulator import SimConfig, Simulator
from enginesim.replay.synth import mooncake_rows
from enginesim.replay.traces import TraceRecord, load_trace, retime, select

HERE = Path(__file__).resolve().parent
TRACE_QUANTUM_S = 3.0  # the conversation trace's timestamps are multiples of this


def slice_records(args: argparse.Namespace) -> list[TraceRecord]:
    """The slice both sides run, re-timed within the trace's bins unless told not to."""
    window = load_trace(args.trace, start_s=args.start, end_s=args.end)
    if args.retime_seed >= 0:
        window = retime(window, args.retime_seed, TRACE_QUANTUM_S)
    return select(window, rate_scale=args.rate_scale)


def write_slice(records: list[TraceRecord], path: Path) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in mooncake_rows(records)))
    return path


def roles_of(prefill: int, decode: int) -> list[str]:
    return ["prefill"] * prefill + ["decode"] * decode


def live_run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    roles = roles_of(args.prefill, args.decode)
    spec = f"prefill@0-{args.prefill - 1},decode@{args.prefill}-{len(roles) - 1}"
    fleet = Fleet(
        len(roles),
        time_scale=args.time_scale,
        extra=["--roles", spec],
        log=work / "fleet.log",
        new_session=True,
        startup_timeout=60,
    ).start()
    try:
        instances = fleet.instances()
        for instance, role in zip(instances, roles, strict=True):
            instance["role"] = role
        config = {
            "cluster": "pd",
            "instances": instances,
            "policy": {"kind": "lmetric"},
            "disaggregation": {"decider": {"kind": "always"}},
            "router": {
                "scrape_interval_s": args.time_scale,
                "health_interval_s": 1.0,
                "health_timeout_s": 5.0,
                "first_byte_timeout_s": 3600.0,
                "queue_timeout_s": 600.0,
                "kv_events": False,
            },
        }
        router = stack.start_live_router(config, work, "pd-router", work / "router.log")
        try:
            loadgen_args = argparse.Namespace(
                time_scale=args.time_scale,
                scrape_interval=1.0,
                trace=write_slice(slice_records(args), work / "slice.jsonl"),
                rate_scale=1.0,  # the slice is at its rate already
                start=0.0,
                end=10.0**9,
                live_timeout=args.live_timeout,
            )
            stack.drive(router, fleet, "pd", loadgen_args, work)
        finally:
            router.stop()
    finally:
        fleet.stop()
    outcomes = [json.loads(line) for line in (work / "pd_live.jsonl").read_text().splitlines()]
    ok = [o for o in outcomes if o["status"] == "ok"]
    scale = args.time_scale
    return {
        "sent": len(outcomes),
        "ok": len(ok),
        "ttft_mean_s": float(np.mean([o["ttft_s"] for o in ok])) / scale,
        "tpot_mean_s": float(np.mean([o["tpot_s"] for o in ok if o["tpot_s"] is not None])) / scale,
    }


def replay_run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:  # as loadgen reads it (ms timestamps)
        records = load_trace(write_slice(slice_records(args), Path(tmp) / "slice.jsonl"))
    roles = tuple(roles_of(args.prefill, args.decode))
    config = SimConfig(instances=len(roles), roles=roles, decider={"kind": "always"})
    result = Simulator(records, "lmetric", config).run()
    ok = [r for r in result.requests if r.status == "ok" and r.first_token_s is not None]
    tpots = [
        (r.finish_s - r.first_token_s) / (r.output_tokens - 1)
        for r in ok
        if r.output_tokens > 1 and r.finish_s is not None and r.first_token_s is not None
    ]
    return {
        "sent": len(result.requests),
        "ok": len(ok),
        "ttft_mean_s": float(np.mean([(r.first_token_s or 0.0) - r.arrival_s for r in ok])),
        "tpot_mean_s": float(np.mean(tpots)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--trace", type=Path, default=CONVERSATION)
    add("--start", type=float, default=0.0)
    add("--end", type=float, default=30.0)
    add("--rate-scale", type=float, default=0.25, help="the slice's arrivals × this")
    add("--time-scale", type=float, default=2.0, help="enginesim wall s per simulated s")
    add("--prefill", type=int, default=2)
    add("--decode", type=int, default=2)
    add("--live-timeout", type=float, default=900.0)
    add("--retime-seed", type=int, default=0, help="-1: the trace's own instants")
    add("--out", type=Path, default=HERE / "live.md")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        live = live_run(args, Path(tmp))
    replay = replay_run(args)
    rows = [
        "| side | sent | ok | TTFT mean (s) | TPOT mean (ms) |",
        "|---|---|---|---|---|",
    ]
    for name, side in (("live", live), ("replay", replay)):
        rows.append(
            f"| {name} | {side['sent']} | {side['ok']} | {side['ttft_mean_s']:.3f} | "
            f"{1000 * side['tpot_mean_s']:.2f} |"
        )
    ttft = live["ttft_mean_s"] / replay["ttft_mean_s"] - 1
    tpot = live["tpot_mean_s"] / replay["tpot_mean_s"] - 1
    text = (
        f"Live against replay, {args.prefill}P+{args.decode}D (decider always), Mooncake "
        f"conversation [{args.start:g}, {args.end:g}) s × {args.rate_scale:g}"
        + (f", re-timed (seed {args.retime_seed})" if args.retime_seed >= 0 else "")
        + f", time scale "
        f"{args.time_scale:g}; {machine()}.\n\n" + "\n".join(rows) + "\n\n"
        f"Live − replay: TTFT {100 * ttft:+.1f}%, TPOT {100 * tpot:+.1f}% "
        f"(goal: within 10%: {'met' if max(abs(ttft), abs(tpot)) <= 0.10 else 'not met'}).\n"
    )
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
