"""``python -m enginesim replay``: replay a trace through routing policies on simulated engines.

Example::

    python -m enginesim replay --trace ../shared/traces/mooncake_conversation_t0-2700s.jsonl \\
        --instances 16 --gpu h20 --model qwen2-7b --max-model-len 131072 \\
        --policy lmetric --policy round_robin --rate-scale 0.8 --out out/replay

Prints one row per policy and the trace's TTFT lower bound; writes ``results.json``,
``<policy>/requests.jsonl``, ``ttft_cdf.png`` and ``<policy>/pending.png`` under ``--out``.

Fleet variation (``--mixed-gpu``, ``--speeds``, ``--step-jitter``, ``--perturb``;
enginesim.engine.fleet) makes the instances unlike each other and unlike the nominal
``--gpu`` engine the policies' cost coefficients describe; each policy's summary in
``results.json`` then lists what every instance ran on (``fleet``), and the lower bound
is taken per request over the instances' kinds of engine (jitter aside).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from itertools import repeat
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import TypeAdapter, ValidationError
from rich.progress import Progress, TaskID

from engine_interface import percentile
from enginesim.engine import GPUS, MODELS, EngineConfig, fleet, transfer
from enginesim.progress import progress_display
from enginesim.replay import metrics, plots
from enginesim.replay.policy_costs import derive_decider
from enginesim.replay.simulator import Fault, SimConfig, SimResult, Simulator
from enginesim.replay.traces import FORMATS, TraceRecord, load_trace, scale_tenant
from router_worker.routing import REGISTRY
from router_worker.routing.flow import FlowParams, TenantSettings
from router_worker.routing.grey import GreyParams

# (summary key, title, width, format spec)
COLUMNS = (
    ("policy", "policy", 12, "<"),
    ("requests", "reqs", 6, ""),
    ("completed", "done", 6, ""),
    ("ttft_mean_s", "TTFT mean", 9, ".3f"),
    ("ttft_p50_s", "p50", 8, ".3f"),
    ("ttft_p90_s", "p90", 8, ".3f"),
    ("ttft_p99_s", "p99", 8, ".3f"),
    ("tpot_mean_s", "TPOT mean", 9, ".4f"),
    ("tpot_p99_s", "p99", 7, ".4f"),
    ("throughput_tok_s", "out tok/s", 9, ".0f"),
    ("hit_ratio", "hit", 6, ".3f"),
    ("load_cv", "load CV", 7, ".2f"),
    ("hotspot_events", "hot", 4, ""),
    ("busy_fraction", "busy", 5, ".2f"),
    ("wall_s", "wall s", 7, ".1f"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--trace", required=True, help="trace file (Mooncake/Bailian JSONL or Azure CSV)")
    add("--format", default="auto", choices=FORMATS)
    add("--instances", type=int, default=16)
    add("--gpu", default="h20", choices=sorted(GPUS))
    add("--model", default="qwen2-7b", choices=sorted(MODELS))
    add(
        "--max-model-len",
        type=int,
        default=0,
        help="context limit (0 = the model's); longer requests are rejected and counted",
    )
    add(
        "--gpu-memory-utilization",
        type=float,
        default=0.9,
        help="share of GPU memory for weights, activations and KV cache (vLLM's option)",
    )
    add(
        "--policy", action="append", default=[], help=f"repeatable, or 'all': {', '.join(REGISTRY)}"
    )
    add(
        "--policy-params",
        default="{}",
        help='JSON {"kind": {params}}, validated by the policies\' own classes',
    )
    add("--rate-scale", type=float, default=1.0, help="X: replay X times faster")
    add("--start", type=float, default=0.0, help="window start, trace seconds")
    add("--end", type=float, default=None, help="window end, trace seconds")
    add("--max-requests", type=int, default=None)
    add("--seed", type=int, default=0)
    add(
        "--telemetry-delay",
        type=float,
        default=0.0,
        help="seconds by which first-token/finish/scrape/KV updates reach the router",
    )
    add("--scrape-interval", type=float, default=1.0, help="0 disables /metrics scrapes")
    add("--kv-events", action="store_true", help="feed engine KV events to the router's index")
    add("--router-block-size", type=int, default=16)
    add("--global-tier-blocks", type=int, default=0, help="shared KV tier size (0 = none)")
    add("--global-tier-bandwidth", type=float, default=25e9, help="tier bytes/s per link")
    add(
        "--global-tier-link-instances",
        type=int,
        default=0,
        help="instances sharing one tier link (0 = one link for the whole cluster)",
    )
    for action in ("fail", "drain", "restore"):
        add(
            f"--{action}",
            action="append",
            default=[],
            metavar="INSTANCE@SECONDS",
            help=f"{action} an instance at a virtual time (repeatable)",
        )
    add(
        "--flow",
        default=None,
        metavar="JSON",
        help="run the router's flow control with these settings (router config `flow`; "
        "'{}': its defaults); without it every request is routed on arrival",
    )
    add(
        "--tenants",
        default="[]",
        metavar="JSON",
        help="the tenants (router config `tenants`) the trace's `tenant` fields name",
    )
    add(
        "--tenant-scale",
        action="append",
        default=[],
        metavar="TENANT=FACTOR",
        help="that tenant's requests FACTOR times as many (what if it doubles: =2)",
    )
    add(
        "--slow",
        action="append",
        default=[],
        metavar="INSTANCE@SECONDSxFACTOR",
        help="an instance runs FACTOR times slower from a virtual time (repeatable; "
        "--restore brings it back)",
    )
    add(
        "--max-continuations",
        type=int,
        default=0,
        help="streams broken by a failed instance continued elsewhere, per request (the "
        "live router's router.max_continuations; 0: they fail)",
    )
    add(
        "--grey",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="grey-failure detection, as a live router runs it with router.grey.enabled "
        "(on by default, as in the routers; --no-grey leaves it out)",
    )
    fleet.add_arguments(parser, seed_default="--seed")
    transfer.add_arguments(parser)
    add(
        "--decider",
        choices=("cost", "always", "never", "prefix_threshold"),
        default="cost",
        help="with --roles: when a request is split (router_worker.routing.disagg)",
    )
    add(
        "--decider-threshold",
        type=int,
        default=256,
        help="--decider prefix_threshold: split above this many uncached prompt tokens",
    )
    add("--decode-policy", default="decode_room", help="with --roles: the decode stage's policy")
    add("--out", required=True, type=Path)
    add("--no-plots", action="store_true")
    add("--no-progress", action="store_true")
    add(
        "--jobs",
        type=int,
        default=1,
        help="policies simulated at once, one process each (a policy's run stays serial and "
        "deterministic; with more than one job there is no progress bar)",
    )


def config_from_args(args: argparse.Namespace) -> SimConfig:
    faults = tuple(
        Fault.parse(action, spec)
        for action in ("fail", "drain", "restore", "slow")
        for spec in getattr(args, action)
    )
    return SimConfig(
        instances=args.instances,
        gpu=args.gpu,
        model=args.model,
        max_model_len=args.max_model_len,
        gpu_memory_utilization=args.gpu_memory_utilization,
        router_block_size=args.router_block_size,
        telemetry_delay_s=args.telemetry_delay,
        scrape_interval_s=args.scrape_interval,
        kv_events=args.kv_events,
        global_tier_blocks=args.global_tier_blocks,
        global_tier_bandwidth=args.global_tier_bandwidth,
        global_tier_link_instances=args.global_tier_link_instances,
        faults=faults,
        grey=GreyParams(enabled=True) if args.grey else None,
        max_continuations=args.max_continuations,
        seed=args.seed,
        policy_params=json.loads(args.policy_params),
        variation=fleet.variation_from_args(args, args.instances, args.gpu, args.seed),
        **flow_from_args(args),
        **disaggregation_from_args(args),
    )


def flow_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """``--flow`` and ``--tenants`` as SimConfig's ``flow`` and ``tenants``; a bad value
    stops the command naming the flag and the field."""
    if args.flow is None:
        if args.tenants != "[]":
            raise SystemExit("--tenants needs --flow (the tenants are flow control's)")
        return {}
    try:
        flow = FlowParams.model_validate(json.loads(args.flow))
        tenants = TypeAdapter(list[TenantSettings]).validate_python(json.loads(args.tenants))
    except json.JSONDecodeError as error:
        raise SystemExit(f"--flow/--tenants: not JSON: {error}") from None
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in error.errors()
        )
        raise SystemExit(f"--flow/--tenants: {problems}") from None
    return {"flow": flow, "tenants": tuple(tenants)}


def tenant_scales(specs: Sequence[str]) -> list[tuple[str, float]]:
    scales = []
    for spec in specs:
        tenant, _, factor = spec.partition("=")
        try:
            value = float(factor)
        except ValueError:
            value = -1.0
        if not tenant or not value >= 0 or value == float("inf"):
            raise SystemExit(f"--tenant-scale wants TENANT=FACTOR (FACTOR >= 0), not {spec!r}")
        scales.append((tenant, value))
    return scales


def disaggregation_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The SimConfig fields of ``--roles`` and the decider's flags (none without roles)."""
    if args.roles is None:
        return {}
    try:
        roles = args.roles.resolve(args.instances, "both")
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None
    decider = derive_decider(args.decider, args.decider_threshold, args.model, args.kv_link)
    return {
        "roles": roles,
        "decider": decider,
        "decode_policy": args.decode_policy,
        "kv_link": args.kv_link,
        "kv_hold_timeout": args.kv_hold_timeout,
    }


def policies_from_args(names: Sequence[str]) -> list[str]:
    chosen: list[str] = []
    for name in names or ["all"]:
        for kind in REGISTRY if name == "all" else [name]:
            if kind not in REGISTRY:
                raise SystemExit(f"unknown policy {kind!r}; known: {', '.join(REGISTRY)}")
            if kind not in chosen:
                chosen.append(kind)
    return chosen


class ProgressBar:
    """The replay's progress on stderr (rich), fed by the simulator's per-request callback."""

    def __init__(self, label: str, enabled: bool = True) -> None:
        self.label, self.enabled = label, enabled
        self._bar: Progress | None = None
        self._task: TaskID | None = None

    def __call__(self, done: int, total: int, now: float) -> None:
        if not self.enabled:
            return
        if self._bar is None:
            self._bar = progress_display()
            self._task = self._bar.add_task(self.label, total=total, now="")
            self._bar.start()
        assert self._task is not None
        self._bar.update(self._task, completed=done, now=f"t={now:,.0f}s")
        if done >= total:
            self._bar.stop()


def run_policy(
    records: list[TraceRecord], policy: str, config: SimConfig, progress: bool = True
) -> SimResult:
    started = time.perf_counter()
    result = Simulator(records, policy, config, ProgressBar(policy, progress)).run()
    result.wall_s = time.perf_counter() - started
    return result


def run_policies(
    records: list[TraceRecord], policies: list[str], config: SimConfig, jobs: int, progress: bool
) -> Iterator[SimResult]:
    """Each policy's result, in the order given; ``jobs`` > 1 runs them in parallel processes."""
    if jobs == 1 or len(policies) == 1:
        for policy in policies:
            yield run_policy(records, policy, config, progress)
        return
    with ProcessPoolExecutor(max_workers=min(jobs, len(policies))) as pool:
        yield from pool.map(run_policy, repeat(records), policies, repeat(config), repeat(False))


def format_row(summary: dict[str, Any]) -> str:
    cells = []
    for key, _, width, spec in COLUMNS:
        value = summary.get(key)
        align = "<" if spec == "<" else ">"
        spec = "" if spec == "<" else spec
        cells.append(format("-" if value is None else format(value, spec), f"{align}{width}"))
    return " ".join(cells)


def header() -> str:
    return " ".join(
        format(title, f"{'<' if spec == '<' else '>'}{width}") for _, title, width, spec in COLUMNS
    )


def write_outputs(
    out: Path,
    results: list[SimResult],
    summaries: list[dict[str, Any]],
    lower: dict[str, Any],
    bound: Any,
    plot: bool,
    title: str,
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(summaries, indent=1) + "\n")
    (out / "lower_bound.json").write_text(json.dumps(lower, indent=1) + "\n")
    for result in results:
        policy_dir = out / result.policy
        policy_dir.mkdir(exist_ok=True)
        with open(policy_dir / "requests.jsonl", "w") as handle:
            for request in result.requests:
                handle.write(json.dumps(request.to_json()) + "\n")
        if plot:
            plots.pending_over_time(
                result,
                policy_dir / "pending.png",
                f"{title} — {result.policy}: pending prefill per instance",
            )
    if plot:
        plots.ttft_cdf(results, out / "ttft_cdf.png", f"{title} — TTFT CDF", bound)


def fleet_lower_bound(
    records: list[TraceRecord], configs: list[EngineConfig]
) -> tuple[dict[str, Any], Any]:
    """The lower bound's row and per-request bounds: each request alone on the idle
    instance that serves it fastest (one kind of engine: ``metrics.lower_bound_summary``)."""
    kinds = fleet.distinct_engines(configs)
    if len(kinds) == 1:
        return metrics.lower_bound_summary(records, kinds[0])
    per_kind = [{id(r) for r in metrics.servable(records, kind)} for kind in kinds]
    accepted = [r for r in records if any(id(r) in ids for ids in per_kind)]
    hits = metrics.infinite_cache_hits(accepted)
    bounds = np.full(len(accepted), np.inf)
    for kind, ids in zip(kinds, per_kind, strict=True):
        rows = np.array([k for k, r in enumerate(accepted) if id(r) in ids], dtype=np.int64)
        subset = [accepted[k] for k in rows]
        bounds[rows] = np.minimum(bounds[rows], metrics.ttft_lower_bound(subset, kind, hits[rows]))
    prompt = sum(r.input_tokens for r in accepted)
    return {
        "policy": "lower_bound",
        "requests": len(records),
        "completed": len(accepted),
        "ttft_mean_s": float(bounds.mean()) if len(bounds) else None,
        "ttft_p50_s": percentile(bounds, 50),
        "ttft_p90_s": percentile(bounds, 90),
        "ttft_p99_s": percentile(bounds, 99),
        "hit_ratio": float(hits.sum() / prompt) if prompt else None,
    }, bounds


def main(args: argparse.Namespace) -> int:
    if args.jobs < 1:
        raise SystemExit(f"--jobs must be at least 1, got {args.jobs}")
    config = config_from_args(args)
    policies = policies_from_args(args.policy)
    records = load_trace(
        args.trace,
        args.format,
        rate_scale=args.rate_scale,
        start_s=args.start,
        end_s=args.end,
        max_requests=args.max_requests,
    )
    for tenant, factor in tenant_scales(args.tenant_scale):
        records = scale_tenant(records, tenant, factor, config.seed)
    print(
        f"# {Path(args.trace).name}: {len(records)} requests, {config.instances}× "
        f"{config.gpu} {config.model}, rate scale {args.rate_scale}, seed {config.seed}"
    )
    print(header())
    results, summaries = [], []
    progress = not args.no_progress and sys.stderr.isatty() and args.jobs == 1
    if config.varied:
        print(f"# fleet variation: {config.variation.describe(config.gpu)}")
    for result in run_policies(records, policies, config, args.jobs, progress):
        summary = metrics.summarize(result)
        if config.flow is not None:
            summary["tenants"] = metrics.by_tenant(result.requests)
        if result.fleet is not None:
            summary["fleet"] = result.fleet
        print(format_row(summary), flush=True)
        results.append(result)
        summaries.append(summary)
    lower, bound = fleet_lower_bound(records, config.engine_configs(None))
    print(format_row(lower) + "   (zero-queue, infinite-cache physical limit)")
    write_outputs(
        args.out, results, summaries, lower, bound, not args.no_plots, Path(args.trace).name
    )
    print(f"# wrote {args.out}/results.json")
    return 0
