"""Where the bench's processes run and what CPU they use: pinning, niceness and the
kernel's per-process accounting (``/proc``)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def runnable_wait_seconds(pid: int) -> float:
    """Time the process's main thread (the router's event loop) spent runnable but waiting
    for a CPU (``/proc/<pid>/schedstat``, field 2): the OS's share of its latency."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9


def cpu_ticks() -> tuple[int, int]:
    """(steal, total) ticks of all CPUs since boot (``/proc/stat``): steal is the time the
    hypervisor ran someone else while this VM had work, which slows every process here."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return fields[7], sum(fields)


def steal_share(before: tuple[int, int], after: tuple[int, int]) -> float:
    total = after[1] - before[1]
    return (after[0] - before[0]) / total if total else 0.0


def set_cpus(pid: int, cpus: set[int]) -> None:
    """Restrict every thread of ``pid`` to ``cpus``."""
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(task), cpus)


PLACEMENTS = {
    "engines-apart": "engines on CPU 0; client and routers on the others (the engines run "
    "alike in both arms; the router's CPU is taken from the client's)",
    "router-apart": "routers on the last CPU; engines and client on the others (the router "
    "as deployed, on cores of its own; it also relieves the client)",
    "shared": "no pinning: client, engines and routers share every CPU",
}


@contextlib.contextmanager
def placed(
    placement: str, engines: subprocess.Popen[bytes], routers: list[subprocess.Popen[bytes]]
) -> Iterator[str]:
    """Pin the processes for the TTFT rows (see PLACEMENTS), then unpin them all."""
    every = os.sched_getaffinity(0)
    if placement == "shared" or len(every) < 2:
        yield PLACEMENTS["shared"]
        return
    low, high = {min(every)}, {max(every)}
    if placement == "engines-apart":
        groups = [([engines.pid], low), ([os.getpid(), *(r.pid for r in routers)], every - low)]
    else:
        groups = [([os.getpid(), engines.pid], every - high), ([r.pid for r in routers], high)]
    try:
        for pids, cpus in groups:
            for pid in pids:
                set_cpus(pid, cpus)
        yield PLACEMENTS[placement]
    finally:
        for pid in [os.getpid(), engines.pid, *(r.pid for r in routers)]:
            set_cpus(pid, every)


def renice(pid: int, value: int) -> None:
    """Set the niceness of every thread of ``pid``."""
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):
            os.setpriority(os.PRIO_PROCESS, int(task), value)


@contextlib.contextmanager
def prioritised(routers: list[subprocess.Popen[bytes]], nice: int) -> Iterator[int]:
    """Run the routers at ``nice`` (every thread), as an operator gives a proxy priority
    over batch work on its host; back to 0 afterwards. Yields the niceness in force: 0
    when this process may not raise priorities (not root, no CAP_SYS_NICE)."""
    try:
        for router in routers:
            renice(router.pid, nice)
    except PermissionError:
        nice = 0
    try:
        yield nice
    finally:
        for router in routers:
            renice(router.pid, 0)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS
