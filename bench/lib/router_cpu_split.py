"""The cpu-split rows of the router overhead study (bench/router_overhead): where a routed
request's CPU goes in the router process, by what runs it (the Python interpreter, numpy,
the kernel's socket work, the event loop and HTTP parser), for the Python floor (the
router's HTTP stack with none of its per-request work) and for Switchyard.

Each contender runs alone in front of 2 enginesim instances under the side-by-side bench's
load (``router_sidebyside.interleaved``: closed-loop workers, half of the requests routed)
while ``perf record`` samples the process on its CPUs; ``perf report --sort dso`` gives the
shares, applied to the process's CPU time per routed request (``/proc/<pid>/stat``). Without
``perf`` (Debian's ``linux-perf``) or the right to use it, only the CPU per request is
printed."""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.lib.cpu import cpu_seconds
from bench.lib.loadclient import run_async
from bench.lib.processes import engine_ports, start_engines
from bench.lib.router_sidebyside import interleaved, router_alone

CONTENDERS = (
    ("python floor", "python-floor", "round_robin"),
    ("switchyard round_robin", "switchyard", "round_robin"),
    ("switchyard lmetric", "switchyard", "lmetric"),
)
# perf's shared-object names → the column they count in (the rest: "loop, parser, libc")
KINDS: tuple[tuple[str, Callable[[str], bool]], ...] = (
    ("Python", lambda dso: dso.startswith("libpython")),
    ("numpy", lambda dso: dso.startswith("_multiarray_umath")),
    ("kernel", lambda dso: dso == "[kernel.kallsyms]"),
)
OTHER = "loop, parser, libc"


def dso_shares(report: str) -> dict[str, float]:
    """``perf report --sort dso --stdio`` output → share (0–1) per column of KINDS."""
    shares = {name: 0.0 for name, _ in KINDS} | {OTHER: 0.0}
    for line in report.splitlines():
        parts = line.split(None, 1)
        if len(parts) != 2 or not parts[0].endswith("%") or line.lstrip().startswith("#"):
            continue
        share, dso = float(parts[0].rstrip("%")) / 100, parts[1].strip()
        column = next((name for name, matches in KINDS if matches(dso)), OTHER)
        shares[column] += share
    return shares


class Sampler:
    """``perf record`` on one process for as long as the ``with`` block runs; ``shares``
    afterwards (None when perf is missing or refused)."""

    def __init__(self, pid: int, workdir: Path) -> None:
        self.pid, self.data = pid, workdir / f"perf-{pid}.data"
        self.perf = shutil.which("perf")
        self.process: subprocess.Popen[bytes] | None = None
        self.shares: dict[str, float] | None = None

    def __enter__(self) -> Sampler:
        if self.perf is not None:
            self.process = subprocess.Popen(
                [self.perf, "record", "-F", "999", "-p", str(self.pid), "-o", str(self.data)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(0.5)  # attached before the load starts
        return self

    def __exit__(self, *_: object) -> None:
        if self.process is None or self.perf is None:
            return
        self.process.send_signal(signal.SIGINT)  # perf then exits 130, its data written
        self.process.wait(30)
        if not self.data.exists():
            return
        report = subprocess.run(
            [self.perf, "report", "-i", str(self.data), "--sort", "dso", "--stdio"],
            capture_output=True,
            text=True,
            check=False,
        )
        if report.returncode == 0:
            self.shares = dso_shares(report.stdout)


def cpu_split_rows(args: argparse.Namespace, streams: int = 8) -> None:
    columns = [name for name, _ in KINDS] + [OTHER]
    print(
        f"\nWhere a routed request's CPU goes in the router process ({streams} streams, "
        "perf record; µs per routed request)"
    )
    print(f"{'router':>24} {'CPU/req':>8} " + " ".join(f"{c:>18}" for c in columns))
    unsplit = False
    with tempfile.TemporaryDirectory() as tmp, start_engines(2, 0.02, Path(tmp)) as (fleet, _):
        engines = engine_ports(fleet)
        for label, kind, policy in CONTENDERS:
            with router_alone(kind, policy, engines, Path(tmp)) as (port, process):
                run_async(interleaved(port, engines, streams, 1.0, args.max_words, seed=-1))
                with Sampler(process.pid, Path(tmp)) as sampler:
                    cpu = cpu_seconds(process.pid)
                    outcomes, _ = run_async(
                        interleaved(port, engines, streams, args.duration, args.max_words, seed=0)
                    )
                    used = cpu_seconds(process.pid) - cpu
            per_request = used / max(sum(o.routed for o in outcomes), 1) * 1e6
            shares = sampler.shares
            unsplit |= shares is None
            cells = (
                [f"{per_request * shares[c]:8.0f} ({shares[c]:4.0%})" for c in columns]
                if shares is not None
                else ["–"] * len(columns)
            )
            print(f"{label:>24} {per_request:8.0f} " + " ".join(f"{c:>18}" for c in cells))
    if unsplit:
        print(
            "perf not found (Debian: apt install linux-perf), or not permitted here "
            "(/proc/sys/kernel/perf_event_paranoid): CPU per request only where no split"
        )
