"""Live vs replay agreement: one trace slice, three policies, two stacks.

The default slice is the heavy one: the Mooncake conversation trace's
[1700, 1900) s at rate scale 1.25, 723 requests (678 within Qwen2-7B's context), about 75%
busy in the replay; the report checks the goals (replay busy >= 0.70, >= 600 requests
served, live mean and p99 TTFT within 10% of the replay's, the same ranking).

For each policy (``lmetric``, ``least_load``, ``round_robin``) the live stack is started fresh:
a devharness.Fleet of 16 enginesim instances (H20, Qwen2-7B, slow motion ``--time-scale
S``) behind a standalone ``python -m router_worker`` with that policy, and
enginesim's load generator (``loadgen``) replays a slice of the Mooncake conversation trace
through the router. The loadgen's rate scale is the target rate scale divided by S,
so the engines see the trace's real relative load; the client TTFTs (wall seconds)
are divided by S to get simulated seconds. Then enginesim's ``replay`` command runs the
same slice, rate scale, cluster and policies in virtual time. The router scrapes
``/metrics`` every S wall seconds, i.e. every simulated second, like the replay's
``--scrape-interval 1``; KV events are off on both sides (the fleet does not publish
them). Engine-side TTFT (the engines' own ``vllm:time_to_first_token_seconds``
histograms, simulated seconds) is reported as well, to separate what the router and
the client add from what the engines did.

    .venv/bin/python -m bench.live_vs_replay.run [--time-scale 2] [--start 1700 --end 1900]
    .venv/bin/python -m bench.live_vs_replay.run --assemble   # README.md from results.json

Every subprocess runs in its own process group and is killed on exit, Ctrl-C or error.
Writes ``README.md`` (the table, the rankings and the goals checked, all from this run) and
``results.json`` (the options and both sides' numbers) under ``--out``.
"""

from __future__ import annotations

import argparse
import atexit
import json
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.lib import live as stack
from bench.lib.matrix import machine

HERE = Path(__file__).resolve().parent

# ----------------------------------------------------------------- report


def rel(live: float, replay: float) -> str:
    return f"{(live - replay) / replay:+.0%}" if replay else "-"


def ranking(values: dict[str, float]) -> str:
    return " < ".join(f"{p} {v:.2f}" for p, v in sorted(values.items(), key=lambda kv: kv[1]))


def _order(rank: str) -> list[str]:
    return [part.split()[0] for part in rank.split(" < ")]


def report(args: argparse.Namespace, live: dict[str, Any], replay: dict[str, Any]) -> str:
    lines = [
        f"trace {args.trace.name} [{args.start:g}, {args.end:g}) s, rate scale "
        f"{args.rate_scale:g}, {args.instances}x H20 qwen2-7b, time scale {args.time_scale:g}"
        f" (loadgen rate scale {args.rate_scale / args.time_scale:.4g}), stream interval "
        f"{args.stream_interval}; TTFT in simulated seconds",
        "",
        "| policy | reqs live/replay | live mean | p50 | p99 | replay mean | p50 | p99 "
        "| Δ mean | Δ p50 | Δ p99 | engine-side mean (live) | hit live/replay "
        "| max send lateness (sim s) | same instance | replay busy | live wall s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for policy in args.policies:
        lv, rp = live[policy], replay[policy]
        lt, rt = lv["ttft"], rp["ttft"]
        if lt is None:
            lines.append(f"| `{policy}` | {lv['ok']}/{rp['ok']} | (no live results) |")
            continue
        eng = lv["engine_ttft_mean"]
        lines.append(
            f"| `{policy}` | {lv['ok']}/{rp['ok']} (live not ok: {lv['not_ok']}) "
            f"| {lt['mean']:.3f} | {lt['p50']:.3f} | {lt['p99']:.3f} "
            f"| {rt['mean']:.3f} | {rt['p50']:.3f} | {rt['p99']:.3f} "
            f"| {rel(lt['mean'], rt['mean'])} | {rel(lt['p50'], rt['p50'])} "
            f"| {rel(lt['p99'], rt['p99'])} "
            f"| {'-' if eng is None else f'{eng:.3f}'} ({lv['engine_count']} reqs) "
            f"| {lv['cached']:.3f}/{rp['cached']:.3f} | {lv['max_late_sim_s']:.2f} "
            f"| {rp['same_instance'][0]}/{rp['same_instance'][1]} | {rp['busy']:.2f} "
            f"| {lv['wall_s']:.0f} |"
        )
    lines += prediction_table(args, live, replay)
    if all(live[p]["ttft"] is not None for p in args.policies):
        lines.append("")
        for key in ("mean", "p99"):
            lrank = ranking({p: live[p]["ttft"][key] for p in args.policies})
            rrank = ranking({p: replay[p]["ttft"][key] for p in args.policies})
            agree = "agree" if _order(lrank) == _order(rrank) else "DISAGREE"
            lines.append(f"- {key} TTFT ranking: live {lrank}; replay {rrank} → {agree}")
        lines += verdict(args, live, replay)
    return "\n".join(lines)


def prediction_table(
    args: argparse.Namespace, live: dict[str, Any], replay: dict[str, Any]
) -> list[str]:
    """The predicted-TTFT error of the policies that predict, live and in the replay."""
    rows = []
    for policy in args.policies:
        for side, results in (("live", live), ("replay", replay)):
            error = results[policy].get("prediction")
            if error:
                rows.append(
                    f"| `{policy}` | {side} | {error['n']} | {error['mape']:.2f} | "
                    f"{error['p90_abs_s']:.3f} | {error['bias_s']:+.3f} |"
                )
    if not rows:
        return []
    return [
        "",
        f"Prediction error (policy params {json.dumps(args.policy_params)}; simulated s; live: "
        "the decision's prediction against the router's measured TTFT):",
        "",
        "| policy | side | n | MAPE | p90 \\|error\\| s | bias s |",
        "|---|---|---:|---:|---:|---:|",
        *rows,
    ]


TOLERANCE = 0.10  # live mean and p99 TTFT within this of the replay's


def verdict(args: argparse.Namespace, live: dict[str, Any], replay: dict[str, Any]) -> list[str]:
    """The goals above, each checked on this run's numbers."""
    busy = min(replay[p]["busy"] for p in args.policies)
    served = min(replay[p]["ok"] for p in args.policies)
    worst = max(
        abs(live[p]["ttft"][key] - replay[p]["ttft"][key]) / replay[p]["ttft"][key]
        for p in args.policies
        for key in ("mean", "p99")
    )
    return [
        "",
        f"- load: replay busy fraction ≥ {busy:.2f} for every policy "
        f"({'meets' if busy >= 0.70 else 'MISSES'} ≥ 0.70)",
        f"- size: ≥ {served} requests served per policy "
        f"({'meets' if served >= 600 else 'MISSES'} ≥ 600)",
        f"- agreement: largest |Δ| over mean and p99 TTFT {worst:.1%} "
        f"({'meets' if worst <= TOLERANCE else 'MISSES'} ≤ {TOLERANCE:.0%})",
    ]


def document(args: argparse.Namespace, data: dict[str, Any]) -> str:
    """README.md: how the run was made, then :func:`report` of its numbers."""
    command = f"python -m bench.live_vs_replay.run {data['command']}".rstrip()
    return "\n".join(
        [
            "# Live vs replay agreement",
            "",
            f"Generated by `{command}` on {data['machine']}, {data['wall_s'] / 60:.0f} min. "
            "For each policy a fresh live stack (a devharness.Fleet of enginesim instances in "
            "slow motion behind a standalone `python -m router_worker`, fed by "
            "enginesim's load generator), then the same slice through the discrete-event "
            "simulator with the same policy code. "
            "Δ = (live − replay) / replay.",
            "",
            report(args, data["live"], data["replay"]),
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = stack.build_parser(__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE, help="README.md and results.json")
    parser.add_argument(
        "--assemble", action="store_true", help="run nothing: README.md from results.json"
    )
    args = parser.parse_args(argv)
    results = args.out / "results.json"
    if args.assemble:
        data = json.loads(results.read_text())
        options = {**data["options"], "trace": Path(data["options"]["trace"])}
        (args.out / "README.md").write_text(document(argparse.Namespace(**options), data))
        return 0
    atexit.register(stack.stop_all)
    signal.signal(signal.SIGINT, stack.on_signal)
    signal.signal(signal.SIGTERM, stack.on_signal)
    work = args.work or Path(tempfile.mkdtemp(prefix="live_vs_replay_"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"# work dir {work}", flush=True)
    began = time.monotonic()
    live, replay = stack.live_and_replay(args, work)
    print(report(args, live, replay))
    data = {
        "command": " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine(),
        "wall_s": time.monotonic() - began,
        "options": {k: v for k, v in vars(args).items() if k not in ("out", "assemble")},
        "live": live,
        "replay": replay,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(data, indent=1, default=str) + "\n")
    (args.out / "README.md").write_text(document(args, data))
    print(f"# total wall {data['wall_s']:.0f} s; wrote {args.out}/README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
