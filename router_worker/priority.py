"""A process's CPU priority: the niceness of every thread of it and of its children.

Linux keeps a niceness per thread (threads and processes started later inherit their
starter's), so giving a running process priority means setting each of its threads. The
router takes priority this way at start-up (``--nice``), and the side-by-side bench gives
each router under test the same.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def set_niceness(pid: int, niceness: int) -> bool:
    """Every thread of process ``pid`` and of its descendants at ``niceness``. False if the
    system refuses (below the current value needs CAP_SYS_NICE or RLIMIT_NICE): every
    thread is then left at the niceness it had."""
    threads = _threads_of_tree(pid)
    before = {thread: os.getpriority(os.PRIO_PROCESS, thread) for thread in threads}
    try:
        for thread in threads:
            with contextlib.suppress(ProcessLookupError):  # a thread that just ended
                os.setpriority(os.PRIO_PROCESS, thread, niceness)
    except PermissionError:
        for thread, previous in before.items():
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, thread, previous)
        return False
    return True


def _threads_of_tree(pid: int) -> list[int]:
    tasks = Path(f"/proc/{pid}/task")
    if not tasks.is_dir():  # no procfs: the process alone (its calling thread, on Linux)
        return [pid]
    threads, pending = [], [pid]
    while pending:
        # A thread or child that ends while we look is simply not there any more.
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            for task in Path(f"/proc/{pending.pop()}/task").iterdir():
                threads.append(int(task.name))
                with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                    children = (task / "children").read_text().split()
                    pending += [int(child) for child in children]
    return threads
