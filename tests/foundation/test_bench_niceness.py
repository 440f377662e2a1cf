"""The side-by-side bench gives a router process priority with ``set_niceness``: every
thread of it and of its children, threads started before the call included."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from bench.lib.cpu import set_niceness

# A process with a thread of its own and a child process, all asleep until killed.
SLEEPERS = """
import subprocess, sys, threading, time
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(child.pid, flush=True)
time.sleep(60)
"""


def _niceness(tid: int) -> int:
    return int(Path(f"/proc/{tid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def _threads(pid: int) -> list[int]:
    return [int(task.name) for task in Path(f"/proc/{pid}/task").iterdir()]


def test_every_thread_of_the_process_and_its_children_gets_the_niceness() -> None:
    parent = subprocess.Popen([sys.executable, "-c", SLEEPERS], stdout=subprocess.PIPE, text=True)
    child: int | None = None
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        deadline = time.monotonic() + 10
        while len(_threads(parent.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        threads = _threads(parent.pid) + _threads(child)
        assert len(threads) >= 3
        assert all(_niceness(t) == os.getpriority(os.PRIO_PROCESS, 0) for t in threads)
        assert set_niceness(parent.pid, 7)
        assert [_niceness(t) for t in threads] == [7] * len(threads)
    finally:
        parent.kill()
        parent.wait()
        if child is not None:
            os.kill(child, 9)
