"""``python -m enginesim capacity``: how many instances would this trace have needed at
this SLO?

Replays the trace through one policy on fleets of different sizes and finds the smallest
whose share of requests meeting both SLOs (TTFT and TPOT, as goodput counts them) reaches
``--attainment``. It takes every option of ``replay`` (the trace, its window and rate, the
GPU, model and KV memory, the router's options, fleet variation); ``--instances`` is the
largest fleet tried. Example::

    python -m enginesim capacity --trace ../shared/traces/mooncake_conversation_t0-2700s.jsonl \\
        --max-model-len 131072 --policy lmetric --ttft-slo 2 --tpot-slo 0.1 \\
        --attainment 0.95 --instances 64 --out out/capacity

The search assumes that more instances never meet the SLO less often (it tries the
largest fleet first, then bisects), prints one row per fleet size tried and writes them,
with the answer, to ``capacity.json`` under ``--out``. Exit status 0 when a size within
the range meets the target, 1 when even the largest does not.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from engine_interface import percentile
from enginesim.replay import metrics
from enginesim.replay.cli import add_arguments as add_replay_arguments
from enginesim.replay.cli import (
    config_from_args,
    fleet_lower_bound,
    policies_from_args,
    run_policy,
)
from enginesim.replay.simulator import SimConfig, SimResult
from enginesim.replay.traces import TraceRecord, load_trace


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_replay_arguments(parser)
    add = parser.add_argument
    add("--ttft-slo", type=float, required=True, help="seconds a first token may take")
    add("--tpot-slo", type=float, required=True, help="seconds an output token may take")
    add(
        "--attainment",
        type=float,
        default=0.9,
        help="share of the trace's requests that must meet both SLOs (0-1]",
    )
    add("--min-instances", type=int, default=1, help="the smallest fleet tried")


def smallest_meeting(
    attainment: Callable[[int], float], low: int, high: int, target: float
) -> int | None:
    """The smallest count in [low, high] whose attainment reaches ``target``, assuming it
    never falls as the count grows; None when ``high`` does not reach it."""
    if attainment(high) < target:
        return None
    while low < high:
        middle = (low + high) // 2
        if attainment(middle) >= target:
            high = middle
        else:
            low = middle + 1
    return high


def zero_queue_attainment(records: list[TraceRecord], config: SimConfig, ttft_s: float) -> float:
    """The share of the trace's requests whose TTFT could meet ``ttft_s`` at all: each alone
    on the fastest idle instance with an infinite cache (the replay's lower bound)."""
    _row, bounds = fleet_lower_bound(records, config.engine_configs(None))
    return float((bounds <= ttft_s).sum() / len(records)) if records else 0.0


def seconds_of(row: dict[str, Any]) -> str:
    value = row.get("queued_prefill_s_mean")
    return "-" if value is None else f"{value:.3f}"


def check(args: argparse.Namespace) -> str:
    """The replay policy to search with; SystemExit naming the option at fault."""
    for name in ("ttft_slo", "tpot_slo"):
        if not getattr(args, name) > 0:
            raise SystemExit(f"--{name.replace('_', '-')} must be a positive number of seconds")
    if not 0 < args.attainment <= 1:
        raise SystemExit(f"--attainment must be in (0, 1], got {args.attainment}")
    if not 1 <= args.min_instances <= args.instances:
        raise SystemExit(
            f"--min-instances must be between 1 and --instances ({args.instances}), "
            f"got {args.min_instances}"
        )
    policies = policies_from_args(args.policy or ["lmetric"])
    if len(policies) != 1:
        raise SystemExit(f"--policy: the search replays one policy, got {', '.join(policies)}")
    return policies[0]


class Trials:
    """Each fleet size's replay, run once and remembered."""

    def __init__(self, records: list[TraceRecord], policy: str, args: argparse.Namespace) -> None:
        self.records, self.policy, self.args = records, policy, args
        self.slo = metrics.Slo(args.ttft_slo, args.tpot_slo)
        self.rows: dict[int, dict[str, Any]] = {}

    def attainment(self, instances: int) -> float:
        if instances not in self.rows:
            config = config_from_args(
                argparse.Namespace(**{**vars(self.args), "instances": instances})
            )
            result = run_policy(self.records, self.policy, config, progress=False)
            summary = metrics.summarize(result, self.slo)
            self.rows[instances] = {"instances": instances, **summary, **signal(result)}
            print(_row(self.rows[instances]), flush=True)
        return self.rows[instances]["slo_attainment"] or 0.0


def signal(result: SimResult) -> dict[str, float | None]:
    """What the autoscaling signal read over the run, as the router exports it: queued
    prefill seconds per healthy instance (mean and p90 over the scrape ticks) and the KV
    pressure's mean: the level to set an autoscaler's target near."""
    samples = result.saturation_samples
    if not len(samples):
        return {
            "queued_prefill_s_mean": None,
            "queued_prefill_s_p90": None,
            "kv_pressure_mean": None,
        }
    return {
        "queued_prefill_s_mean": float(samples[:, 0].mean()),
        "queued_prefill_s_p90": percentile(samples[:, 0], 90),
        "kv_pressure_mean": float(samples[:, 1].mean()),
    }


def _row(summary: dict[str, Any]) -> str:
    def seconds(key: str) -> str:
        value = summary.get(key)
        return "-" if value is None else f"{value:.3f}"

    return (
        f"{summary['instances']:>9} {summary['slo_attainment'] or 0:>10.3f} "
        f"{seconds('ttft_p90_s'):>9} {seconds('ttft_p99_s'):>9} {seconds('tpot_p99_s'):>9} "
        f"{summary['busy_fraction']:>5.2f} {seconds('queued_prefill_s_mean'):>8} "
        f"{seconds('queued_prefill_s_p90'):>8} {seconds('kv_pressure_mean'):>6}"
    )


def main(args: argparse.Namespace) -> int:
    policy = check(args)
    records = load_trace(
        args.trace,
        args.format,
        rate_scale=args.rate_scale,
        start_s=args.start,
        end_s=args.end,
        max_requests=args.max_requests,
    )
    print(
        f"# {len(records)} requests under {policy}, {args.gpu} {args.model}, rate scale "
        f"{args.rate_scale}: the fewest instances ({args.min_instances}-{args.instances}) where "
        f"{args.attainment:.0%} meet TTFT ≤ {args.ttft_slo:g} s and TPOT ≤ {args.tpot_slo:g} s"
    )
    print(f"{'instances':>9} {'attainment':>10} {'TTFT p90':>9} {'TTFT p99':>9} "
          f"{'TPOT p99':>9} {'busy':>5} {'queued s':>8} {'q p90':>8} {'KV':>6}")  # fmt: skip
    trials = Trials(records, policy, args)
    needed = smallest_meeting(
        trials.attainment, args.min_instances, args.instances, args.attainment
    )
    ceiling = zero_queue_attainment(records, config_from_args(args), args.ttft_slo)
    if needed is not None:
        level = trials.rows[needed]
        print(
            f"# at {needed} instances the autoscaling signal read {seconds_of(level)} s of "
            "queued prefill per instance on average: a target for "
            "switchyard_router_fleet_pending_prefill_seconds"
        )
    if needed is None:
        print(
            f"# not even {args.instances} instances: raise --instances, or the SLO (alone on "
            f"an idle instance with an infinite cache, {ceiling:.1%} would meet the TTFT SLO)"
        )
    else:
        print(f"# needed: {needed} instances")
    args.out.mkdir(parents=True, exist_ok=True)
    report = {
        "policy": policy,
        "slo": {"ttft_s": args.ttft_slo, "tpot_s": args.tpot_slo},
        "attainment": args.attainment,
        "needed": needed,
        "zero_queue_ttft_attainment": ceiling,
        "tried": [trials.rows[n] for n in sorted(trials.rows)],
    }
    (args.out / "capacity.json").write_text(json.dumps(report, indent=1) + "\n")
    return 0 if needed is not None else 1
