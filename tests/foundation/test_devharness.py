"""The shared harness the tests, benches and demo start processes with."""

from __future__ import annotations

import ast
import asyncio
import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from devharness import (
    Fleet,
    ManagedProcess,
    ProcessExited,
    ProcessSet,
    WaitTimeout,
    free_ports,
    stop_together,
    wait_http,
    wait_until,
    wait_until_async,
)
from devharness.ports import EPHEMERAL_RANGE

ROOT = Path(__file__).resolve().parents[2]
IGNORES_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
# the same, then an empty file at argv[1] once its handler is installed
IGNORES_TERM_READY = (
    "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "open(sys.argv[1], 'w').close(); time.sleep(60)"
)
# argv: its own mark (written at its SIGTERM), then the others'; exits 0 once all exist
WAITS_FOR_ALL = """
import os, signal, sys, time
marks = sys.argv[1:]
signal.signal(signal.SIGTERM, lambda *_: open(marks[0], "w").close())
open(marks[0] + ".ready", "w").close()
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    if all(os.path.exists(m) for m in marks):
        sys.exit(0)
    time.sleep(0.01)
sys.exit(1)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"


def test_free_ports_are_consecutive_bindable_and_below_the_ephemeral_range() -> None:
    base = free_ports(3, gap=100)
    assert base + 102 < int(EPHEMERAL_RANGE.read_text().split()[0])
    for port in [*range(base, base + 3), *range(base + 100, base + 103)]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_wait_until_returns_the_predicate_value_and_treats_transient_errors_as_not_yet() -> None:
    calls = iter([ConnectionRefusedError(), 0, "ready"])

    def probe() -> object:
        value = next(calls)
        if isinstance(value, Exception):
            raise value
        return value

    assert wait_until(probe, 5, "probe", interval=0.01) == "ready"


def test_wait_until_times_out_naming_what_it_waited_for() -> None:
    started = time.monotonic()
    with pytest.raises(WaitTimeout, match="the impossible"):
        wait_until(lambda: False, 0.3, "the impossible", interval=0.01)
    assert time.monotonic() - started >= 0.3  # it waited its whole timeout


def test_wait_until_other_errors_are_not_swallowed() -> None:
    with pytest.raises(KeyError):
        wait_until(lambda: dict[str, int]()["x"], 5, "a key")


async def test_wait_until_async_lets_the_loop_bring_the_condition_about() -> None:
    done: list[str] = []

    async def finish() -> None:
        await asyncio.sleep(0.05)
        done.append("ready")

    task = asyncio.create_task(finish())
    assert await wait_until_async(lambda: done and done[0], 5, "the task", interval=0.01) == (
        "ready"
    )
    await task


async def test_wait_until_async_times_out_and_ends_at_a_dead_process_like_wait_until() -> None:
    started = time.monotonic()
    with pytest.raises(WaitTimeout, match=r"timed out after 0\.3 s waiting for the impossible"):
        await wait_until_async(lambda: False, 0.3, "the impossible", interval=0.01)
    assert time.monotonic() - started >= 0.3  # it waited its whole timeout
    with (
        ManagedProcess([sys.executable, "-c", "raise SystemExit(3)"]) as dead,
        pytest.raises(ProcessExited, match="the server: process exited with 3"),
    ):
        await wait_until_async(lambda: False, 30, "the server", dead.process)


def test_a_dead_process_ends_the_wait_at_once_with_its_log(tmp_path: Path) -> None:
    log = tmp_path / "dead.log"
    with (
        ManagedProcess(
            [sys.executable, "-c", "print('boom'); raise SystemExit(3)"], log=log
        ) as dead,
        pytest.raises(ProcessExited, match=r"exited with 3\nboom"),
    ):  # not a WaitTimeout
        wait_http("http://127.0.0.1:9/", 30, process=dead.process, log=log)


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    with ManagedProcess(
        [sys.executable, "-c", IGNORES_TERM_READY, str(ready)], grace=0.5
    ) as stubborn:
        wait_until(ready.exists, 30, "its SIGTERM handler installed", stubborn.process)
    assert stubborn.poll() == -signal.SIGKILL


def test_a_process_set_stops_each_group_with_its_children(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    spawner = (
        "import subprocess, sys, time; child = subprocess.Popen([sys.executable, '-c',"
        f" {IGNORES_TERM!r}]); open({str(pid_file)!r}, 'w').write(str(child.pid));"
        " time.sleep(60)"
    )
    with ProcessSet(grace=0.5) as stack:
        parent = stack.start([sys.executable, "-c", spawner])
        child = int(
            wait_until(lambda: pid_file.read_text() if pid_file.exists() else None, 10, "pid")
        )
        assert _alive(child)
    assert parent.poll() is not None
    wait_until(lambda: not _alive(child), 5, "the grandchild to be gone")


def test_processes_stopped_together_share_one_grace(tmp_path: Path) -> None:
    """Every process gets its SIGTERM before any grace runs out: each of these exits only
    once all three have had theirs, which they can only do within one shared grace (one
    after the other, the first would be killed at the end of its own grace waiting for
    the others' SIGTERM)."""
    script = tmp_path / "waits_for_all.py"
    script.write_text(WAITS_FOR_ALL)
    marks = [tmp_path / f"term{k}" for k in range(3)]
    stubborn = [
        ManagedProcess(
            [sys.executable, str(script), str(mark), *(str(m) for m in marks if m != mark)]
        ).start()
        for mark in marks
    ]
    wait_until(lambda: all(Path(f"{m}.ready").exists() for m in marks), 30, "handlers")
    stop_together(stubborn, grace=20.0)
    assert all(m.exists() for m in marks)
    assert [p.poll() for p in stubborn] == [0, 0, 0]  # none killed: one shared grace


def test_what_is_left_after_the_shared_grace_is_killed(tmp_path: Path) -> None:
    ready = [tmp_path / f"ready{k}" for k in range(2)]
    stubborn = [
        ManagedProcess([sys.executable, "-c", IGNORES_TERM_READY, str(mark)]).start()
        for mark in ready
    ]
    wait_until(lambda: all(m.exists() for m in ready), 30, "handlers")
    stop_together(stubborn, grace=0.5)
    assert [p.poll() for p in stubborn] == [-signal.SIGKILL] * 2


def test_a_fleet_serves_its_instances_recovers_their_faults_and_stops() -> None:
    with Fleet(2, time_scale=0.05, kv_events=True, kv_encoding="array") as fleet:
        assert fleet.healthy()
        urls = [spec["url"] for spec in fleet.instances(kv=True)]
        assert urls == fleet.urls() == [fleet.url(0), fleet.url(1)]
        assert fleet.instances(kv=True)[1]["kv_replay"] == fleet.kv_replay_endpoint(1)
        fleet.fault(1, "kill")
        wait_until(lambda: not fleet.healthy(), 10, "instance 1 killed", ignore=())
        fleet.recover()
        assert fleet.healthy() and fleet.metric(1, "vllm:num_requests_running") == 0
    assert fleet.process.poll() is not None


def test_a_fleet_on_a_taken_port_fails_with_its_log(tmp_path: Path) -> None:
    """Fixed ports are not retried: the start ends at the process's exit, with its log."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        fleet = Fleet(1, base_port=port, log=tmp_path / "fleet.log")
        with pytest.raises(ProcessExited, match=r"(?i)address already in use"):
            fleet.start()
    assert fleet.process.poll() is not None


def test_nothing_deployed_imports_the_harness() -> None:
    deployed = ["router_worker", "enginesim", "chat_templates", "controlplane"]
    offenders = []
    for package in deployed:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom)
                    else []
                )
                if any(n.split(".")[0] == "devharness" for n in names):
                    offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []
