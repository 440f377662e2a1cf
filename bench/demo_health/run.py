"""How busy and how healthy the running demo is, measured from the outside.

``make demo`` (scripts/demo.py) runs a simulated 16 x H20 cluster under a replayed trace;
the README's busy figures come from an offline replay of that trace. This measures the live
demo over its public interfaces only: every second each engine's ``/metrics`` (vLLM's
names), at the window's start and end the router's ``/metrics`` (its TTFT histogram; it
needs the router's admin token) and the engines' counters and TTFT histograms, and the CPU
time of the demo's processes from ``/proc``.

    .venv/bin/python -m bench.demo_health.run [--minutes 5] [--warmup 60] [--report FILE]
    .venv/bin/python -m bench.demo_health.run --start-demo [--rate 0.68] [--time-scale 2]

Without ``--start-demo`` it measures a demo already running on the ports scripts/demo.py
reads (SWITCHYARD_DEMO_ENGINE_PORT, SWITCHYARD_DEMO_INSTANCES, SWITCHYARD_ROUTER_PORT, or
the flags); the router's TTFT needs SWITCHYARD_ROUTER_ADMIN_TOKEN (or ``--admin-token``),
the token the demo was started with. With ``--start-demo`` it starts scripts/demo.py
itself (fresh: the demo empties its database and Redis database, as every demo run
does), with an admin token of its own, waits until it is up, measures, and stops it with
SIGINT, as Ctrl-C does.

Busy fraction of an instance: the share of its samples with
``vllm:num_requests_running`` > 0. TTFT percentiles are interpolated within the buckets of
the histogram's difference over the window (as Prometheus' ``histogram_quantile``); the
router's are wall seconds, divided by the engines' time scale (``enginesim:time_scale``)
for simulated seconds, the engines' own are simulated seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import math
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

import engine_interface as ei
from bench.lib.cpu import cpu_seconds
from devharness import ManagedProcess, WaitTimeout, wait_until

ROOT = Path(__file__).resolve().parents[2]
ROUTER_TTFT = "switchyard_router_ttft_seconds"
ROUTER_REQUESTS = "switchyard_router_requests_total"
TIME_SCALE = "enginesim:time_scale"
REQUEST_SUCCESS = ei.REQUEST_SUCCESS.total
# What the demo's processes run, for a demo this did not start and whose scripts/demo.py
# process cannot be found (then other stacks on the machine may be counted too).
DEMO_COMMANDS = ("enginesim serve", "router_worker", "loadgen", "uvicorn controlplane", "celery")
BUSY_GOAL = 0.70  # a healthy, realistic cluster (README.md, the demo)
STARTUP_TIMEOUT_S = 240.0
STOP_GRACE_S = 60.0


# ----------------------------------------------------------------- pure statistics


def busy_fraction(running: Sequence[float]) -> float | None:
    """Share of the samples with at least one request running (None without samples)."""
    return float(np.mean(np.asarray(running) > 0)) if len(running) else None


def histogram_quantile(histogram: ei.Histogram, q: float) -> float | None:
    """The ``q``-th percentile (q in [0, 100]) of a histogram's observations, linearly
    interpolated within its bucket as Prometheus' ``histogram_quantile`` does (the first
    bucket from 0). ``inf`` when it lies beyond the last finite bound, None without
    observations."""
    if histogram.count <= 0 or not histogram.buckets:
        return None
    rank = q / 100 * histogram.count
    lower, below = 0.0, 0.0
    for le, cumulative in histogram.buckets:
        if cumulative >= rank and cumulative > below:
            if math.isinf(le):
                return math.inf
            return lower + (le - lower) * (rank - below) / (cumulative - below)
        lower, below = le, cumulative
    return math.inf


def ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator > 0 else None


# ----------------------------------------------------------------- samples


@dataclass
class InstanceSeries:
    """One engine instance's per-second samples, and its counters at the window's ends."""

    url: str
    running: list[float] = field(default_factory=list)
    waiting: list[float] = field(default_factory=list)
    kv_usage: list[float] = field(default_factory=list)
    first: ei.ScrapedMetrics | None = None
    last: ei.ScrapedMetrics | None = None

    def add(self, scraped: ei.ScrapedMetrics) -> None:
        if self.first is None:
            self.first = scraped
        self.last = scraped
        for series, value in (
            (self.running, scraped.running),
            (self.waiting, scraped.waiting),
            (self.kv_usage, scraped.kv_usage),
        ):
            if value is not None:
                series.append(value)

    def counter(self, attribute: str) -> float:
        """The growth of counter ``attribute`` between the first and the last sample."""
        if self.first is None or self.last is None:
            return 0.0
        return (getattr(self.last, attribute) or 0.0) - (getattr(self.first, attribute) or 0.0)


@dataclass
class Ends:
    """What is read at the window's start and end only: cumulative counts and histograms."""

    engine_ttft: ei.Histogram | None = None
    completed: float = 0.0  # the engines' vllm:request_success, aborted ones not counted
    router_ttft: ei.Histogram | None = None
    router_requests: float | None = None
    time_scale: float | None = None


async def get_text(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> str | None:
    try:
        response = await client.get(url, headers=headers, timeout=5.0)
    except httpx.HTTPError:
        return None
    return response.text if response.status_code == 200 else None


def read_ends(engine_texts: Sequence[str | None], router_text: str | None) -> Ends:
    ends = Ends()
    texts = [t for t in engine_texts if t is not None]
    ends.engine_ttft = ei.merge_histograms([ei.parse_metrics(t).histogram("ttft") for t in texts])
    for text in texts:
        samples, _ = ei.read_samples(text, [REQUEST_SUCCESS, TIME_SCALE])
        aborted = ei.sample_total(samples, REQUEST_SUCCESS, finished_reason="abort")
        ends.completed += ei.sample_total(samples, REQUEST_SUCCESS) - aborted
        if ends.time_scale is None and any(s.name == TIME_SCALE for s in samples):
            ends.time_scale = ei.sample_total(samples, TIME_SCALE)
    if router_text is not None:
        samples, _ = ei.read_samples(router_text, [ROUTER_TTFT, ROUTER_REQUESTS])
        ends.router_ttft = ei.read_histogram(samples, ROUTER_TTFT)
        ends.router_requests = ei.sample_total(samples, ROUTER_REQUESTS)
    return ends


# ----------------------------------------------------------------- CPU from /proc


def process_table() -> dict[int, tuple[int, str]]:
    """Every process: pid → (parent pid, command line with spaces)."""
    table: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            table[int(entry.name)] = (int(stat[1]), cmdline)
    return table


def descendants(roots: set[int], table: dict[int, tuple[int, str]]) -> set[int]:
    """``roots`` and every process below them."""
    found = set(roots) & table.keys()
    grew = True
    while grew:
        more = {pid for pid, (ppid, _) in table.items() if ppid in found} - found
        found |= more
        grew = bool(more)
    return found


def environment_of(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return {key: value for key, _, value in pairs}


def find_demo(engine_port: int, table: dict[int, tuple[int, str]]) -> set[int]:
    """The scripts/demo.py processes serving engines from ``engine_port``."""
    return {
        pid
        for pid, (_, cmdline) in table.items()
        if "scripts/demo.py" in cmdline
        and any(arg.endswith("scripts/demo.py") for arg in argv_of(pid))
        and environment_of(pid).get("SWITCHYARD_DEMO_ENGINE_PORT", "9100") == str(engine_port)
    }


def argv_of(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [arg.decode(errors="replace") for arg in raw.split(b"\0") if arg]


class CpuMeter:
    """CPU seconds of a set of processes (found again at every sample: children come and
    go) since the first sample; a process's time counts from its first sample, or from 0
    when it was started after the first sample."""

    def __init__(self, find: Callable[[dict[int, tuple[int, str]]], set[int]]) -> None:
        self.find = find
        self.baseline: dict[int, float] | None = None
        self.latest: dict[int, float] = {}

    def sample(self) -> None:
        now: dict[int, float] = {}
        for pid in self.find(process_table()):
            with contextlib.suppress(OSError, IndexError, ValueError):
                now[pid] = cpu_seconds(pid)
        if self.baseline is None:
            self.baseline = dict(now)
        self.latest.update(now)

    @property
    def seconds(self) -> float:
        base = self.baseline or {}
        return sum(seconds - base.get(pid, 0.0) for pid, seconds in self.latest.items())


def machine_busy_ticks() -> tuple[float, float]:
    """(busy, total) CPU ticks of the whole machine since boot (/proc/stat)."""
    values = [float(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    total = sum(values[:8])  # guest time is already in user and nice
    return total - idle, total


# ----------------------------------------------------------------- the measurement


@dataclass
class Target:
    engine_urls: list[str]
    router_url: str
    admin_token: str | None


@dataclass
class Measurement:
    instances: list[InstanceSeries]
    start: Ends
    end: Ends
    wall_s: float
    samples: int
    cpu_s: float
    cpu_processes: int
    cpu_found: str
    machine_cores: float
    own_cpu_s: float  # this measurement's process
    load_start: tuple[float, float, float]
    load_end: tuple[float, float, float]
    time_scale: float


async def scrape_ends(client: httpx.AsyncClient, target: Target) -> Ends:
    headers = {"Authorization": f"Bearer {target.admin_token}"} if target.admin_token else {}
    router = get_text(client, target.router_url + "/metrics", headers)
    engines = [get_text(client, url + "/metrics", {}) for url in target.engine_urls]
    router_text, *engine_texts = await asyncio.gather(router, *engines)
    return read_ends(engine_texts, router_text)


async def sample_once(client: httpx.AsyncClient, series: list[InstanceSeries]) -> None:
    texts = await asyncio.gather(*(get_text(client, s.url + "/metrics", {}) for s in series))
    for instance, text in zip(series, texts, strict=True):
        if text is not None:
            instance.add(ei.parse_metrics(text, histograms=False))


async def sample_window(
    client: httpx.AsyncClient,
    series: list[InstanceSeries],
    seconds: float,
    interval: float,
    meter: CpuMeter,
) -> int:
    """Samples every instance (and the CPU) every ``interval`` s for ``seconds``; returns
    how many rounds were taken."""
    started, rounds = time.monotonic(), 0
    while time.monotonic() - started < seconds:
        await sample_once(client, series)
        meter.sample()
        rounds += 1
        await asyncio.sleep(max(0.0, rounds * interval - (time.monotonic() - started)))
    return rounds


async def measure(
    target: Target,
    seconds: float,
    interval: float,
    cpu: tuple[CpuMeter, str],
    time_scale: float | None,
) -> Measurement:
    series = [InstanceSeries(url) for url in target.engine_urls]
    meter, how = cpu
    load_start, (busy0, total0) = os.getloadavg(), machine_busy_ticks()
    own0, started = cpu_seconds(os.getpid()), time.monotonic()
    meter.sample()
    async with httpx.AsyncClient() as client:
        start = await scrape_ends(client, target)
        rounds = await sample_window(client, series, seconds, interval, meter)
        end = await scrape_ends(client, target)
    meter.sample()
    busy1, total1 = machine_busy_ticks()
    return Measurement(
        instances=series,
        start=start,
        end=end,
        wall_s=time.monotonic() - started,
        samples=rounds,
        cpu_s=meter.seconds,
        cpu_processes=len(meter.latest),
        cpu_found=how,
        machine_cores=(busy1 - busy0) / max(total1 - total0, 1) * (os.cpu_count() or 1),
        own_cpu_s=cpu_seconds(os.getpid()) - own0,
        load_start=load_start,
        load_end=os.getloadavg(),
        time_scale=time_scale or end.time_scale or start.time_scale or 1.0,
    )


# ----------------------------------------------------------------- the report


def fmt(value: float | None, digits: int = 2) -> str:
    if value is None:
        return "n/a"
    if math.isinf(value):
        return "beyond the last bucket"
    return f"{value:.{digits}f}"


def fleet_rows(m: Measurement) -> list[tuple[str, str]]:
    busy = [busy_fraction(s.running) for s in m.instances]
    known = [(b, s) for b, s in zip(busy, m.instances, strict=True) if b is not None]
    running = [v for s in m.instances for v in s.running]
    waiting = [v for s in m.instances for v in s.waiting]
    kv = [v for s in m.instances for v in s.kv_usage]
    hits = sum(s.counter("prefix_hits") for s in m.instances)
    queries = sum(s.counter("prefix_queries") for s in m.instances)
    rows = [
        ("fleet busy (mean over instances of the share of samples running > 0)",
         fmt(float(np.mean([b for b, _ in known])) if known else None)),
        ("busiest instance", _instance(max(known, key=lambda k: k[0]) if known else None)),
        ("least busy instance", _instance(min(known, key=lambda k: k[0]) if known else None)),
        ("mean running per instance", fmt(_mean(running))),
        ("mean waiting per instance", fmt(_mean(waiting))),
        ("share of samples with requests waiting",
         fmt(float(np.mean(np.asarray(waiting) > 0)) if waiting else None)),
        ("KV usage mean / max", f"{fmt(_mean(kv), 3)} / {fmt(max(kv, default=None), 3)}"),
        ("prefix-cache hit ratio (tokens, window)", fmt(ratio(hits, queries), 3)),
    ]  # fmt: skip
    return rows


def _mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if len(values) else None


def _instance(found: tuple[float, InstanceSeries] | None) -> str:
    return "n/a" if found is None else f"{found[0]:.2f} ({found[1].url})"


def latency_rows(m: Measurement) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    router = _since(m.end.router_ttft, m.start.router_ttft)
    engine = _since(m.end.engine_ttft, m.start.engine_ttft)
    for q in (50, 90, 99):
        wall = histogram_quantile(router, q) if router else None
        rows.append((f"TTFT p{q} at the router, wall s", fmt(wall, 3)))
        simulated = None if wall is None else wall / m.time_scale
        rows.append((f"TTFT p{q} at the router, simulated s", fmt(simulated, 3)))
    for q in (50, 99):
        value = histogram_quantile(engine, q) if engine else None
        rows.append((f"TTFT p{q} engine-side (vLLM histogram), simulated s", fmt(value, 3)))
    answered = None
    if m.end.router_requests is not None and m.start.router_requests is not None:
        answered = (m.end.router_requests - m.start.router_requests) / m.wall_s
    rows += [
        ("requests completed per wall s (engines' vllm:request_success, not aborted)",
         fmt((m.end.completed - m.start.completed) / m.wall_s)),
        ("requests answered per wall s (router)", fmt(answered)),
    ]  # fmt: skip
    return rows


def _since(end: ei.Histogram | None, start: ei.Histogram | None) -> ei.Histogram | None:
    if end is None:
        return None
    return end.since(start) if start is not None else end


def machine_rows(m: Measurement) -> list[tuple[str, str]]:
    def load(values: tuple[float, float, float]) -> str:
        return " / ".join(f"{v:.2f}" for v in values)

    return [
        (f"demo CPU, cores ({m.cpu_processes} processes: {m.cpu_found})",
         fmt(m.cpu_s / m.wall_s)),
        ("this measurement's own CPU, cores", fmt(m.own_cpu_s / m.wall_s)),
        (f"machine CPU busy, cores (of {os.cpu_count()})", fmt(m.machine_cores)),
        ("load average 1 / 5 / 15 min at start", load(m.load_start)),
        ("load average 1 / 5 / 15 min at end", load(m.load_end)),
    ]  # fmt: skip


def instance_table(m: Measurement) -> list[str]:
    lines = [
        "| instance | busy | mean running | mean waiting | KV mean | KV max | hit ratio |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for s in m.instances:
        hit = ratio(s.counter("prefix_hits"), s.counter("prefix_queries"))
        lines.append(
            f"| {s.url} | {fmt(busy_fraction(s.running))} | {fmt(_mean(s.running))} "
            f"| {fmt(_mean(s.waiting))} | {fmt(_mean(s.kv_usage), 3)} "
            f"| {fmt(max(s.kv_usage, default=None), 3)} | {fmt(hit, 3)} |"
        )
    return lines


def report(m: Measurement, header: str) -> str:
    rows = [*fleet_rows(m), *latency_rows(m), *machine_rows(m)]
    busy = [b for s in m.instances if (b := busy_fraction(s.running)) is not None]
    verdict = (
        f"fleet busy {np.mean(busy):.2f}: {'within' if np.mean(busy) <= BUSY_GOAL else 'over'}"
        f" the goal of <= {BUSY_GOAL:.0%}"
        if busy
        else "no engine answered /metrics: nothing measured"
    )
    return "\n".join(
        [
            header,
            f"window {m.wall_s:.0f} s wall, {m.samples} samples per instance, time scale "
            f"{m.time_scale:g} (simulated s = wall s / {m.time_scale:g})",
            "",
            "| quantity | value |",
            "|---|---:|",
            *(f"| {name} | {value} |" for name, value in rows),
            "",
            f"- {verdict}",
            "",
            *instance_table(m),
            "",
        ]
    )


# ----------------------------------------------------------------- the demo


def demo_env(args: argparse.Namespace, token: str) -> dict[str, str]:
    """The environment scripts/demo.py runs with: ours, on the ports measured."""
    env = {
        **os.environ,
        "SWITCHYARD_ROUTER_ADMIN_TOKEN": token,
        "SWITCHYARD_ROUTER_PORT": args.router.rsplit(":", 1)[1].rstrip("/"),
        "SWITCHYARD_DEMO_ENGINE_PORT": str(args.engine_port),
        "SWITCHYARD_DEMO_INSTANCES": str(args.instances),
    }
    env.pop("SWITCHYARD_DEMO_KEEP", None)  # fresh
    if args.rate is not None:
        env["SWITCHYARD_DEMO_RATE"] = f"{args.rate:g}"
    if args.time_scale is not None:
        env["SWITCHYARD_DEMO_TIME_SCALE"] = f"{args.time_scale:g}"
    return env


def http_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def demo_up(target: Target, log: Path, process: ManagedProcess) -> bool:
    if process.poll() is not None:
        raise RuntimeError(f"scripts/demo.py exited:\n{process.tail()}")
    if "Press Ctrl-C to stop everything." not in log.read_text(errors="replace"):
        return False
    urls = [target.router_url + "/health", *(u + "/health" for u in target.engine_urls)]
    return all(http_ok(url) for url in urls)


@contextlib.contextmanager
def started_demo(args: argparse.Namespace, target: Target, log: Path) -> Iterator[int]:
    """scripts/demo.py, started fresh and up (router and engines healthy); yields its pid.
    Stopped on leaving with SIGINT (as Ctrl-C), then its group killed if still there."""
    assert target.admin_token is not None
    process = ManagedProcess(
        [sys.executable, str(ROOT / "scripts" / "demo.py")],
        env=demo_env(args, target.admin_token),
        log=log,
        cwd=ROOT,
        new_session=True,
        grace=10.0,
    ).start()
    try:
        print(f"started scripts/demo.py (pid {process.pid}, output in {log})", flush=True)
        up = functools.partial(demo_up, target, log, process)
        wait_until(up, STARTUP_TIMEOUT_S, "the demo", interval=1.0, ignore=(OSError,))
        yield process.pid
    finally:
        stop_demo(process, log)


def stop_demo(process: ManagedProcess, log: Path) -> None:
    with contextlib.suppress(ProcessLookupError):
        process.running.send_signal(signal.SIGINT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.running.wait(timeout=STOP_GRACE_S)
    process.stop()  # what is left of its group, if anything
    clean = "Stopped every process the demo started." in log.read_text(errors="replace")
    print(f"scripts/demo.py stopped ({'cleanly' if clean else 'see ' + str(log)})", flush=True)


# ----------------------------------------------------------------- command line


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, str(default)))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    router_port = env_int("SWITCHYARD_ROUTER_PORT", 8000)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--minutes", type=float, default=5.0, help="measurement window")
    p.add_argument("--warmup", type=float, default=60.0, help="seconds before the window")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    p.add_argument(
        "--engine-port",
        type=int,
        default=env_int("SWITCHYARD_DEMO_ENGINE_PORT", 9100),
        help="the first instance's port (SWITCHYARD_DEMO_ENGINE_PORT)",
    )
    p.add_argument(
        "--instances",
        type=int,
        default=env_int("SWITCHYARD_DEMO_INSTANCES", 16),
        help="instances of the main cluster (SWITCHYARD_DEMO_INSTANCES)",
    )
    p.add_argument(
        "--router",
        default=f"http://127.0.0.1:{router_port}",
        help="the router's URL (port: SWITCHYARD_ROUTER_PORT)",
    )
    p.add_argument(
        "--admin-token",
        default=os.environ.get("SWITCHYARD_ROUTER_ADMIN_TOKEN"),
        help="the router's admin token, for its /metrics (SWITCHYARD_ROUTER_ADMIN_TOKEN)",
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=None,
        help="wall s per simulated s (default: the engines' enginesim:time_scale); "
        "with --start-demo, the demo's SWITCHYARD_DEMO_TIME_SCALE",
    )
    p.add_argument(
        "--rate",
        type=float,
        default=None,
        help="with --start-demo: the demo's SWITCHYARD_DEMO_RATE",
    )
    p.add_argument(
        "--start-demo",
        action="store_true",
        help="start scripts/demo.py (fresh), measure it, stop it",
    )
    p.add_argument(
        "--demo-pid",
        type=int,
        default=None,
        help="the demo's scripts/demo.py pid, for its CPU (default: found by port)",
    )
    p.add_argument("--report", type=Path, default=None, help="also write the report here")
    return p.parse_args(argv)


def target_of(args: argparse.Namespace) -> Target:
    urls = [f"http://127.0.0.1:{args.engine_port + k}" for k in range(args.instances)]
    token = args.admin_token
    if args.start_demo and not token:
        token = secrets.token_urlsafe(24)
    return Target(urls, args.router.rstrip("/"), token)


def cpu_meter(args: argparse.Namespace, demo_pid: int | None) -> tuple[CpuMeter, str]:
    """What counts as the demo's processes, and how they were found."""
    roots = {demo_pid} if demo_pid is not None else find_demo(args.engine_port, process_table())
    if roots:
        how = f"the tree under scripts/demo.py pid {', '.join(map(str, sorted(roots)))}"
        return CpuMeter(lambda table: descendants(roots, table)), how

    def by_command(table: dict[int, tuple[int, str]]) -> set[int]:
        return {pid for pid, (_, cmd) in table.items() if any(c in cmd for c in DEMO_COMMANDS)}

    return CpuMeter(by_command), "command lines (no scripts/demo.py found: may count others)"


def run(args: argparse.Namespace, target: Target, demo_pid: int | None) -> str:
    if args.warmup > 0:
        print(f"warming up {args.warmup:g} s ...", flush=True)
        time.sleep(args.warmup)
    print(f"measuring {args.minutes:g} min ...", flush=True)
    scale = None if args.start_demo else args.time_scale
    cpu = cpu_meter(args, demo_pid)
    m = asyncio.run(measure(target, args.minutes * 60, args.interval, cpu, scale))
    if target.admin_token is None:
        print("no admin token: the router's TTFT is not read", file=sys.stderr)
    header = (
        f"demo health, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
        f"{args.instances} instances from port {args.engine_port}, router {target.router_url}"
        f", after {args.warmup:g} s of warm-up"
    )
    return report(m, header)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    target = target_of(args)
    if args.start_demo:
        log = Path(tempfile.mkdtemp(prefix="demo-health-")) / "demo.log"
        try:
            with started_demo(args, target, log) as pid:
                text = run(args, target, pid)
        except (WaitTimeout, RuntimeError) as error:
            print(f"the demo did not come up: {error}", file=sys.stderr)
            return 1
    else:
        text = run(args, target, args.demo_pid)
    print(text)
    if args.report is not None:
        args.report.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
