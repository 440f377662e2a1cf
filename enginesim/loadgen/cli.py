"""``python -m enginesim loadgen``: replay a trace against an OpenAI-compatible URL.

Example::

    python -m enginesim loadgen --trace ../shared/traces/mooncake_conversation_t0-2700s.jsonl \\
        --target http://127.0.0.1:8080 --rate-scale 0.5 --max-requests 500 \\
        --hotspot-burst --burst-at 60

The target is the live router or an ``enginesim serve`` instance. Prefix traces go to
``/v1/completions`` with token-id prompts; session traces (Bailian, agentic) to
``/v1/chat/completions`` with the earlier turns as messages (see ``payloads``).

Hot-prefix burst (``--hotspot-burst``): ``kill -USR1 <pid>`` starts one at any time
(each signal another); ``--burst-at S`` also starts one S seconds after the start.
Bounds: ``--concurrency-limit`` requests in flight at most; ``--max-requests``,
``--duration`` and the end of the trace (unless ``--loop``) stop sending. Ctrl-C stops
cleanly: no new sends, in-flight streams closed, summary printed; a second Ctrl-C exits
at once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from engine_interface import percentile
from enginesim.loadgen.runner import BurstSettings, LoadGenerator, Outcome
from enginesim.progress import progress_display
from enginesim.replay.synth import BurstParams
from enginesim.replay.traces import FORMATS, load_trace, spread_ties


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--trace", required=True, type=Path)
    add("--format", default="auto", choices=FORMATS)
    add(
        "--target",
        required=True,
        action="append",
        help="base URL, e.g. http://127.0.0.1:8080; repeat it to spread requests "
        "round-robin over several targets (routers behind a load balancer)",
    )
    add("--model", default=None, help="model name (default: the target's first /v1/models)")
    add(
        "--max-model-len",
        type=int,
        default=None,
        help="skip records whose prompt + output exceed this many tokens (default: the "
        "target's max_model_len from /v1/models, as vLLM would refuse them)",
    )
    add("--rate-scale", type=float, default=1.0, help="X: send X times faster than the trace")
    add("--start", type=float, default=0.0, help="trace window start, seconds")
    add("--end", type=float, default=None, help="trace window end, seconds")
    add("--max-requests", type=int, default=None, help="stop after sending this many")
    add("--duration", type=float, default=None, help="stop sending after this many seconds")
    add("--loop", action="store_true", help="start the trace over when it ends")
    add("--concurrency-limit", type=int, default=256, help="requests in flight at most")
    add("--timeout", type=float, default=600.0, help="per-request read timeout, seconds")
    add("--hotspot-burst", action="store_true", help="enable bursts (SIGUSR1 / --burst-at)")
    add("--burst-at", type=float, default=None, help="start a burst S seconds in")
    defaults = BurstParams()
    add("--burst-duration", type=float, default=defaults.duration_s)
    add("--burst-rate", type=float, default=defaults.burst_rate, help="requests/s")
    add("--burst-prefix-tokens", type=int, default=defaults.prefix_tokens)
    add("--burst-suffix-tokens", type=float, default=defaults.suffix_tokens)
    add("--burst-output-tokens", type=float, default=defaults.output_tokens)
    add(
        "--burst-ramp",
        type=float,
        default=defaults.ramp_s,
        help="seconds over which the burst's rate grows from 0 (0 = a step)",
    )
    add(
        "--spread-ties",
        action="store_true",
        help="spread arrivals that share a timestamp over their bucket (the conversation "
        "trace's 3 s buckets), as the replay benches do (seeded by --seed)",
    )
    add("--seed", type=int, default=0)
    add("--out", type=Path, default=None, help="write one JSON line per request here")
    add("--no-progress", action="store_true")


def _burst(args: argparse.Namespace) -> BurstSettings | None:
    if not args.hotspot_burst:
        return None
    params = BurstParams(
        duration_s=args.burst_duration,
        burst_rate=args.burst_rate,
        prefix_tokens=args.burst_prefix_tokens,
        suffix_tokens=args.burst_suffix_tokens,
        output_tokens=args.burst_output_tokens,
        ramp_s=args.burst_ramp,
        seed=args.seed,
    )
    return BurstSettings(params, args.burst_at)


def discover_model(target: str) -> tuple[str, int | None]:
    """The target's first model and its max_model_len (None when not reported)."""
    try:
        response = httpx.get(target.rstrip("/") + "/v1/models", timeout=5.0)
        card = response.json()["data"][0]
        return str(card["id"]), card.get("max_model_len")
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        raise SystemExit(f"could not read {target}/v1/models ({exc}); pass --model") from None


def fitting(records: list, max_model_len: int | None) -> list:
    """The records the target can serve at all (prompt + output within its context)."""
    if max_model_len is None:
        return records
    return [r for r in records if r.input_tokens + r.output_tokens <= max_model_len]


class ProgressLine:
    """The load generator's progress on stderr: requests done, errors, in flight."""

    def __init__(self, total: int | None) -> None:
        self._bar = progress_display()
        self._task = self._bar.add_task("done", total=total, now="")
        self._bar.start()

    def __call__(self, generator: LoadGenerator) -> None:
        done = [o for o in generator.outcomes if o.status != "pending"]
        errors = sum(o.status == "error" for o in done)
        self._bar.update(
            self._task,
            completed=len(done),
            now=(
                f"sent {len(generator.outcomes)} errors {errors} in flight "
                f"{len(generator.in_flight)} bursts {generator.bursts} t={generator.elapsed():.0f}s"
            ),
        )

    def close(self) -> None:
        self._bar.stop()


def summarize(outcomes: list[Outcome], elapsed: float) -> dict[str, Any]:
    ok = [o for o in outcomes if o.status == "ok"]
    ttft = np.array([o.ttft_s for o in ok])
    tpot = np.array([o.tpot_s for o in ok if o.tpot_s is not None])
    prompt = sum(o.prompt_tokens or 0 for o in ok)
    cached = sum(o.cached_tokens or 0 for o in ok)

    def stat(values: np.ndarray, q: float | None = None) -> float | None:
        if q is not None:
            return percentile(values, q)
        return float(values.mean()) if len(values) else None

    return {
        "sent": len(outcomes),
        "ok": len(ok),
        "errors": sum(o.status == "error" for o in outcomes),
        "cancelled": sum(o.status in ("cancelled", "pending") for o in outcomes),
        "late_1s": sum(o.sent_s - o.scheduled_s > 1.0 for o in outcomes),
        "ttft_mean_s": stat(ttft),
        "ttft_p50_s": stat(ttft, 50),
        "ttft_p90_s": stat(ttft, 90),
        "ttft_p99_s": stat(ttft, 99),
        "tpot_mean_s": stat(tpot),
        "tpot_p99_s": stat(tpot, 99),
        "output_tok_s": sum(o.output_tokens for o in ok) / max(elapsed, 1e-9),
        "cached_ratio": cached / prompt if prompt else None,
        "elapsed_s": elapsed,
    }


def format_summary(summary: dict[str, Any]) -> str:
    lines = ["", f"{'metric':<14} {'value':>12}"]
    for key, value in summary.items():
        text = (
            "-" if value is None else (f"{value:.4f}" if isinstance(value, float) else str(value))
        )
        lines.append(f"{key:<14} {text:>12}")
    return "\n".join(lines)


def _install_signals(generator: LoadGenerator) -> None:
    loop = asyncio.get_running_loop()

    def first_interrupt() -> None:
        loop.remove_signal_handler(signal.SIGINT)  # a second Ctrl-C kills at once
        sys.stderr.write("\nstopping: closing in-flight requests...\n")
        generator.stop()

    loop.add_signal_handler(signal.SIGINT, first_interrupt)
    loop.add_signal_handler(signal.SIGTERM, generator.stop)
    if generator.burst is not None:
        loop.add_signal_handler(signal.SIGUSR1, generator.trigger_burst)


async def _run(args: argparse.Namespace, generator: LoadGenerator) -> list[Outcome]:
    _install_signals(generator)
    if generator.burst is not None:
        sys.stderr.write(f"burst on demand: kill -USR1 {os.getpid()}\n")
    return await generator.run()


def main(args: argparse.Namespace) -> int:
    records = load_trace(
        args.trace, args.format, rate_scale=args.rate_scale, start_s=args.start, end_s=args.end
    )
    if args.spread_ties:
        records = spread_ties(records, seed=args.seed)
    model, max_model_len = (args.model, None) if args.model else discover_model(args.target[0])
    limit = args.max_model_len or max_model_len
    served = fitting(records, limit)
    if len(served) < len(records):
        print(
            f"# skipping {len(records) - len(served)} of {len(records)} records longer "
            f"than the target's context of {limit} tokens"
        )
    records = served
    show = not args.no_progress and sys.stderr.isatty()
    bounded = not (args.loop or args.duration)
    total = min(len(records), args.max_requests or len(records)) if bounded else None
    progress = ProgressLine(total) if show else None
    generator = LoadGenerator(
        records,
        args.target,
        model,
        concurrency_limit=args.concurrency_limit,
        timeout_s=args.timeout,
        loop=args.loop,
        max_requests=args.max_requests,
        duration_s=args.duration,
        burst=_burst(args),
        on_progress=progress,
    )
    print(
        f"# {args.trace.name}: {len(records)} requests → {', '.join(args.target)} ({model}), "
        f"rate scale {args.rate_scale}, concurrency ≤ {args.concurrency_limit}"
    )
    outcomes = asyncio.run(_run(args, generator))
    if progress is not None:
        progress.close()
    summary = summarize(outcomes, generator.elapsed())
    print(format_summary(summary))
    if args.out is not None:
        with open(args.out, "w", encoding="utf-8") as handle:
            for outcome in outcomes:
                handle.write(json.dumps(vars(outcome)) + "\n")
    return 0 if summary["errors"] == 0 else 1
