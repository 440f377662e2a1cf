"""``--nice``: a router asks for priority on a shared host, and runs on if refused; the
side-by-side bench gives a router under test priority the same way (``set_niceness``:
every thread of it and of its children, threads started before the call included)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from router_worker.priority import set_niceness
from tests.router.helpers import MODEL, launch_router

# Starts a thread, then calls take_priority: the thread started before it gets the niceness.
PROBE = """
import os, sys, threading, time
from pathlib import Path
from router_worker.cli import take_priority
threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
granted = take_priority(int(sys.argv[1]))
nices = sorted({int(t.joinpath("stat").read_text().rsplit(")", 1)[1].split()[16])
                for t in Path("/proc/self/task").iterdir()})
print(granted, len(list(Path("/proc/self/task").iterdir())), nices)
"""


def _probe(niceness: int, *prefix: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prefix, sys.executable, "-c", PROBE, str(niceness)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


def test_every_thread_takes_the_niceness() -> None:
    granted, threads, nices = _probe(6).stdout.split(maxsplit=2)
    assert (granted, nices.strip()) == ("True", "[6]")
    assert int(threads) >= 2


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="util-linux setpriv not installed")
def test_a_refused_priority_is_logged_and_the_router_runs_at_its_own() -> None:
    unprivileged = ("setpriv", "--bounding-set=-sys_nice", "--inh-caps=-sys_nice")
    done = _probe(-5, *unprivileged)
    granted, _, nices = done.stdout.split(maxsplit=2)
    assert (granted, nices.strip()) == ("False", "[0]")
    assert "--nice -5: not permitted" in done.stderr


def _niceness(tid: int) -> int:
    return int(Path(f"/proc/{tid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def _threads(pid: int) -> list[int]:
    return [int(task.name) for task in Path(f"/proc/{pid}/task").iterdir()]


def test_a_router_started_with_nice_serves_with_all_its_threads_at_it(tmp_path: Path) -> None:
    document = {
        "model": MODEL,
        "instances": [{"name": "i0", "url": "http://127.0.0.1:9"}],
        "policy": {"kind": "round_robin"},
    }
    router = launch_router(tmp_path, document, "--nice", "4")
    try:
        assert {_niceness(t) for t in _threads(router.managed.pid)} == {4}
    finally:
        router.stop()


# A process with a thread of its own and a child process, all asleep until killed.
SLEEPERS = """
import subprocess, sys, threading, time
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(child.pid, flush=True)
time.sleep(60)
"""


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
