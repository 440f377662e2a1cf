"""A live stack beside the replay, for the studies that compare them (bench/live_vs_replay,
bench/prediction's ``--live``, bench/multi_router's live half): child processes in their
own process groups (killed on exit), the slow-motion enginesim fleet (a devharness.Fleet)
behind a standalone router (devharness.start_router) fed by ``enginesim loadgen``, the same
slice through ``enginesim replay``, and the statistics both sides are reported in."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.lib.matrix import CONVERSATION
from devharness import Fleet, ProcessSet, Router, start_router
from engine_interface import parse_metrics, percentile
from enginesim.replay.policy_costs import fill_coefficients, unset_fields

REPO = Path(__file__).resolve().parents[2]
TRACE = CONVERSATION
PY = sys.executable
CHILDREN = ProcessSet(cwd=REPO, grace=5.0)  # each in its own process group
ADMIN_TOKEN = "bench-live-vs-replay"


# ----------------------------------------------------------------- processes


def spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    return CHILDREN.start(args, log)


def stop(proc: subprocess.Popen[bytes]) -> None:
    CHILDREN.stop(proc)


def stop_all() -> None:
    CHILDREN.stop_all()


def on_signal(signum: int, _frame: Any) -> None:
    stop_all()
    raise SystemExit(128 + signum)


# ----------------------------------------------------------------- statistics


def stats(values: list[float]) -> dict[str, float | None]:
    arr = np.asarray(values, dtype=float)
    return {
        "n": len(arr),
        "mean": float(arr.mean()),
        "p50": percentile(arr, 50),
        "p99": percentile(arr, 99),
    }


def prediction_error(
    pairs: list[tuple[float | None, float | None]], scale: float
) -> dict[str, float] | None:
    """MAPE, p90 |error| and bias (simulated s) of (predicted, measured) TTFT pairs in wall
    seconds at ``scale`` wall s per simulated s; None without predictions."""
    kept = [(p, m) for p, m in pairs if p is not None and m is not None and m > 0]
    if not kept:
        return None
    predicted, measured = (np.array(side, dtype=float) / scale for side in zip(*kept, strict=True))
    error = predicted - measured
    return {
        "n": len(kept),
        "mape": float(np.mean(np.abs(error) / measured)),
        "p90_abs_s": float(np.percentile(np.abs(error), 90)),
        "bias_s": float(error.mean()),
    }


def slow_motion_params(policy: str, args: argparse.Namespace) -> dict[str, Any]:
    """The policy's params for the live router. The router measures wall time, and the
    engines run ``time_scale`` wall seconds per simulated one, so cost coefficients in
    seconds are derived for the fleet (as the control plane does) and stretched by it."""
    params = dict(args.policy_params.get(policy, {}))
    filled = fill_coefficients(policy, params, "h20", "qwen2-7b")
    for name in unset_fields(policy, params):
        if name.endswith("_s"):
            filled[name] = filled[name] * args.time_scale
        elif name == "prefill_tps":
            filled[name] = filled[name] / args.time_scale
    return filled


def variation_args(args: argparse.Namespace) -> list[str]:
    """The fleet's variation, the same for the live fleet and the replay."""
    out = ["--fleet-seed", str(args.fleet_seed)]
    if args.perturb:
        out += ["--perturb", repr(args.perturb)]
    if args.step_jitter:
        out += ["--step-jitter", repr(args.step_jitter)]
    return out


def engine_ttft(fleet: Fleet) -> tuple[float, int]:
    """Sum and count of the fleet's TTFT histograms (simulated seconds)."""
    total, count = 0.0, 0
    for url in fleet.urls():
        text = httpx.get(url + "/metrics", timeout=10).text
        ttft = parse_metrics(text).histogram("ttft")
        if ttft is not None:
            total, count = total + ttft.sum, count + int(ttft.count)
    return total, count


class DecisionPoller(threading.Thread):
    """Collects the router's routing decisions from ``/admin/state`` (it shows only the last
    50 finished requests, so it is polled every 0.5 s); request id -> decision."""

    def __init__(self, target: str, token: str) -> None:
        super().__init__(daemon=True)
        self.url, self.headers = target + "/admin/state", {"Authorization": f"Bearer {token}"}
        self.decisions: dict[str, dict[str, Any]] = {}
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            self.poll()
            self.halt.wait(0.5)

    def poll(self) -> None:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            state = httpx.get(self.url, headers=self.headers, timeout=5).json()
            for item in state.get("recent_decisions", []):
                kept = ("instance", "prompt_tokens", "status", "cached_tokens", "reason", "ttft_s")
                decision = {key: item.get(key) for key in kept}
                decision["predicted_ttft_s"] = (item.get("details") or {}).get("predicted_ttft_s")
                self.decisions[item["request_id"]] = decision


def placement_agreement(
    decisions: list[dict[str, Any]], replay_rows: list[dict[str, Any]]
) -> tuple[int, int]:
    """(same instance, compared) over requests whose prompt length is unique in the slice."""
    live: dict[int, list[str]] = {}
    for item in decisions:
        live.setdefault(int(item["prompt_tokens"]), []).append(item["instance"])
    lengths = [r["prompt_tokens"] for r in replay_rows]
    same = compared = 0
    for row in replay_rows:
        matches = live.get(row["prompt_tokens"], [])
        if lengths.count(row["prompt_tokens"]) != 1 or len(matches) != 1:
            continue
        compared += 1
        same += matches[0] == row["instance"]
    return same, compared


# ----------------------------------------------------------------- one live run


def start_fleet(args: argparse.Namespace, log: Path, variation: list[str] | None = None) -> Fleet:
    """A devharness.Fleet of ``args.instances`` H20 / Qwen2-7B enginesim instances in slow
    motion (``args.time_scale``), in its own process group, started and healthy."""
    return Fleet(
        args.instances,
        time_scale=args.time_scale,
        variation=variation_args(args) if variation is None else variation,
        extra=["--stream-interval", str(args.stream_interval)],
        log=log,
        new_session=True,
        startup_timeout=60,
    ).start()


def start_live_router(
    config: dict[str, Any], work: Path, name: str, log: Path, redis_url: str = "none"
) -> Router:
    """A standalone router on ``config`` with the bench's admin token, in its own process
    group, started and healthy."""
    router = start_router(
        work,
        config,
        name=name,
        admin_token=ADMIN_TOKEN,
        redis_url=redis_url,
        log_level="WARNING",
        log=log,
        new_session=True,
        wait=False,
    )
    try:
        router.wait_healthy(60)
    except BaseException:
        router.stop()
        raise
    return router


def run_live(policy: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    fleet = start_fleet(args, work / f"{policy}_fleet.log")
    try:
        return live_through(fleet, policy, args, work)
    finally:
        fleet.stop()


def live_through(fleet: Fleet, policy: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    scale = args.time_scale
    config = {
        "cluster": "h20-qwen2-7b",
        "block_size": 16,
        "instances": fleet.instances(),
        "policy": {"kind": policy, "params": slow_motion_params(policy, args), "seed": 0},
        "router": {
            # one simulated second between scrapes, as in the replay
            "scrape_interval_s": args.scrape_interval * scale,
            "health_interval_s": 1.0,
            "health_timeout_s": 5.0,
            # long slow-motion prefills must not be retried elsewhere
            "first_byte_timeout_s": 3600.0,
            "queue_timeout_s": 600.0,
            "max_body_bytes": 64 * 1024 * 1024,
            "kv_events": False,
        },
    }
    router = start_live_router(config, work, f"{policy}-router", work / f"{policy}_router.log")
    try:
        return drive(router, fleet, policy, args, work)
    finally:
        router.stop()


def drive(
    router: Router, fleet: Fleet, policy: str, args: argparse.Namespace, work: Path
) -> dict[str, Any]:
    """``enginesim loadgen`` replays the slice through ``router``; the run's summary."""
    scale = args.time_scale
    target = router.url
    time.sleep(3 * args.scrape_interval * scale)  # a few scrapes and probes first

    poller = DecisionPoller(target, ADMIN_TOKEN)
    poller.start()
    out = work / f"{policy}_live.jsonl"
    started = time.monotonic()
    loadgen = spawn(
        [
            PY,
            "-m",
            "enginesim",
            "loadgen",
            "--trace",
            str(args.trace),
            "--target",
            target,
            "--rate-scale",
            repr(args.rate_scale / scale),
            "--start",
            str(args.start),
            "--end",
            str(args.end),
            "--timeout",
            "3600",
            "--concurrency-limit",
            "1024",
            # send over-context prompts too: the replay routes them and the engine refuses
            # them (a round-robin slot each), so live must do the same
            "--max-model-len",
            str(10**9),
            "--out",
            str(out),
            "--no-progress",
        ],
        work / f"{policy}_loadgen.log",
    )
    try:
        loadgen.wait(args.live_timeout)
    except subprocess.TimeoutExpired:
        print(
            f"# {policy}: loadgen still running after {args.live_timeout:.0f} s; "
            "stopping it (in-flight requests are cancelled)",
            flush=True,
        )
        with contextlib.suppress(ProcessLookupError):
            os.killpg(loadgen.pid, signal.SIGINT)  # clean stop: writes --out
        loadgen.wait(60)
    wall = time.monotonic() - started
    stop(loadgen)
    poller.halt.set()
    poller.join()
    poller.poll()
    decisions = list(poller.decisions.values())
    (work / f"{policy}_decisions.json").write_text(json.dumps(decisions, indent=0))
    eng_sum, eng_count = engine_ttft(fleet)

    outcomes = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    ok = [o for o in outcomes if o["status"] == "ok"]
    late = [o["sent_s"] - o["scheduled_s"] for o in outcomes]
    return {
        "sent": len(outcomes),
        "ok": len(ok),
        "wall_s": wall,
        "not_ok": len(outcomes) - len(ok),
        "ttft": stats([o["ttft_s"] / scale for o in ok]) if ok else None,
        "cached": sum(o["cached_tokens"] or 0 for o in ok)
        / max(sum(o["prompt_tokens"] or 0 for o in ok), 1),
        "max_late_sim_s": max(late) / scale if late else 0.0,
        "engine_ttft_mean": eng_sum / eng_count if eng_count else None,
        "engine_count": eng_count,
        "decisions": len(decisions),
        "prediction": prediction_error(
            [(d["predicted_ttft_s"], d["ttft_s"]) for d in decisions], scale
        ),
    }


# ----------------------------------------------------------------- replay


def run_replay(args: argparse.Namespace, work: Path) -> dict[str, dict[str, Any]]:
    out = work / "replay"
    cmd = [
        PY,
        "-m",
        "enginesim",
        "replay",
        "--trace",
        str(args.trace),
        "--instances",
        str(args.instances),
        "--gpu",
        "h20",
        "--model",
        "qwen2-7b",
        "--rate-scale",
        repr(args.rate_scale),
        "--start",
        str(args.start),
        "--end",
        str(args.end),
        "--scrape-interval",
        str(args.scrape_interval),
        "--out",
        str(out),
        "--no-plots",
        "--no-progress",
        "--policy-params",
        json.dumps(args.policy_params),
        *variation_args(args),
    ]
    for policy in args.policies:
        cmd += ["--policy", policy]
    proc = spawn(cmd, work / "replay.log")
    if proc.wait() != 0:
        raise RuntimeError(f"replay failed, see {work / 'replay.log'}")
    stop(proc)
    summary = {r["policy"]: r for r in json.loads((out / "results.json").read_text())}
    results: dict[str, dict[str, Any]] = {}
    for policy in args.policies:
        rows = [
            json.loads(line) for line in (out / policy / "requests.jsonl").read_text().splitlines()
        ]
        ok = [r for r in rows if r.get("first_token_s") is not None]
        decisions_path = work / f"{policy}_decisions.json"
        decisions = json.loads(decisions_path.read_text()) if decisions_path.exists() else []
        results[policy] = {
            "same_instance": placement_agreement(decisions, rows),
            "requests": len(rows),
            "ok": len(ok),
            "busy": summary[policy]["busy_fraction"],
            "ttft": stats([r["first_token_s"] - r["arrival_s"] for r in ok]),
            "cached": sum(r["cached_tokens"] or 0 for r in ok)
            / max(sum(r["prompt_tokens"] or 0 for r in ok), 1),
            "prediction": prediction_error(
                [(r.get("predicted_ttft_s"), r["first_token_s"] - r["arrival_s"]) for r in ok], 1.0
            ),
        }
    return results


def build_parser(description: str) -> argparse.ArgumentParser:
    """The live-and-replay options (slice, fleet, policies); ``live_and_replay`` takes them."""
    parser = argparse.ArgumentParser(description=description)
    add = parser.add_argument
    add("--trace", type=Path, default=TRACE)
    add("--start", type=float, default=1700.0)
    add("--end", type=float, default=1900.0)
    add("--rate-scale", type=float, default=1.25, help="~75%% busy on the default slice")
    add("--time-scale", type=float, default=2.0, help="enginesim wall s per simulated s")
    add("--stream-interval", type=int, default=1)
    add("--scrape-interval", type=float, default=1.0, help="simulated seconds")
    add("--instances", type=int, default=16)
    add("--policies", nargs="+", default=["lmetric", "least_load", "round_robin"])
    add("--policy-params", type=json.loads, default={}, help='JSON {"kind": {params}}')
    add("--perturb", type=float, default=0.0, help="engines mis-modelled by up to ± this")
    add("--step-jitter", type=float, default=0.0, help="per-step noise of the engines")
    add("--fleet-seed", type=int, default=1)
    add("--live-timeout", type=float, default=1200.0, help="wall s per live run at most")
    add("--work", type=Path, default=None, help="logs and raw results (default: a temp dir)")
    add("--resume", action="store_true", help="reuse the live results already in --work")
    return parser


def live_and_replay(args: argparse.Namespace, work: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Each policy live (fresh stack each), then all of them in the replay."""
    live: dict[str, Any] = {}
    try:
        for policy in args.policies:
            saved = work / f"{policy}_live_summary.json"
            if args.resume and saved.exists():
                live[policy] = json.loads(saved.read_text())
            else:
                live[policy] = run_live(policy, args, work)
                saved.write_text(json.dumps(live[policy]))
            print(f"# live {policy}: {json.dumps(live[policy])}", flush=True)
        replay = run_replay(args, work)
        for policy in args.policies:
            print(f"# replay {policy}: {json.dumps(replay[policy])}", flush=True)
    finally:
        stop_all()
    (work / "summary.json").write_text(json.dumps({"live": live, "replay": replay}, indent=1))
    return live, replay
