"""The CPU time the bench's processes use, from the kernel's per-process accounting
(``/proc``)."""

from __future__ import annotations

import os
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (all its threads), seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def set_niceness(pid: int, niceness: int) -> bool:
    """Give every thread of process ``pid`` and of its descendants ``niceness`` (Linux
    nice values are per thread; threads started later inherit their starter's). False if
    the system refuses (a negative value needs CAP_SYS_NICE): nothing is changed then."""
    try:
        for tid in _threads_of_tree(pid):
            os.setpriority(os.PRIO_PROCESS, tid, niceness)
    except PermissionError:
        for tid in _threads_of_tree(pid):
            os.setpriority(os.PRIO_PROCESS, tid, 0)
        return False
    return True


def _threads_of_tree(pid: int) -> list[int]:
    threads, pending = [], [pid]
    while pending:
        for task in Path(f"/proc/{pending.pop()}/task").iterdir():
            threads.append(int(task.name))
            pending += [int(child) for child in (task / "children").read_text().split()]
    return threads
