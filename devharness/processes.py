"""Subprocesses that are always stopped: terminate, then kill after a grace period."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self


class ProcessExited(RuntimeError):
    """A process we were waiting on exited first."""


def stop_process(process: subprocess.Popen[Any], grace: float = 10.0) -> None:
    """SIGTERM, and SIGKILL if it has not exited within ``grace`` seconds."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def start_process(
    argv: list[str],
    *,
    env: dict[str, str] | None = None,
    log: Path | None = None,
    cwd: Path | str | None = None,
    new_session: bool = False,
    **popen: Any,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` with stdout and stderr appended to ``log`` (discarded without one) and
    no stdin. ``popen`` overrides any of those (e.g. ``stdout=subprocess.PIPE``)."""
    output: Any = subprocess.DEVNULL
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        output = log.open("ab")
    try:
        options = {
            "stdout": output,
            "stderr": subprocess.STDOUT,
            "stdin": subprocess.DEVNULL,
            **popen,
        }
        return subprocess.Popen(argv, cwd=cwd, env=env, start_new_session=new_session, **options)
    finally:
        if log is not None:
            output.close()  # the child holds its own descriptor


class ManagedProcess:
    """A subprocess with its output in a log file (or discarded), stopped on exit from a
    ``with`` block. ``new_session`` puts it in its own process group, so ``stop`` reaches
    the children it starts too (Celery's pool, uvicorn's workers)."""

    def __init__(
        self,
        argv: list[str],
        *,
        env: dict[str, str] | None = None,
        log: Path | None = None,
        cwd: Path | str | None = None,
        new_session: bool = False,
        grace: float = 10.0,
        **popen: Any,
    ) -> None:
        self.argv = argv
        self.env = env
        self.log = log
        self.cwd = cwd
        self.new_session = new_session
        self.grace = grace
        self.popen = popen
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Self:
        self.process = start_process(
            self.argv,
            env=self.env,
            log=self.log,
            cwd=self.cwd,
            new_session=self.new_session,
            **self.popen,
        )
        return self

    @property
    def pid(self) -> int:
        return self.running.pid

    @property
    def running(self) -> subprocess.Popen[bytes]:
        if self.process is None:
            raise RuntimeError(f"{self.argv[0]} was never started")
        return self.process

    def poll(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the process (its whole group with ``new_session``)."""
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            if self.new_session:
                os.killpg(self.process.pid, signum)
            else:
                self.process.send_signal(signum)

    def kill_group(self) -> None:
        """SIGKILL whatever is left of the group, even after its leader has exited."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            if self.new_session:
                os.killpg(self.process.pid, signal.SIGKILL)
            else:
                self.process.kill()
        self.process.wait()

    def stop(self) -> None:
        stop_together([self], self.grace)

    def tail(self, chars: int = 3000) -> str:
        if self.log is None:
            return ""
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def __enter__(self) -> Self:
        return self.start() if self.process is None else self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


class ProcessSet:
    """Processes started together and stopped together, newest first: a bench's or the
    demo's stack. Each runs in its own process group; ``start`` returns the Popen."""

    def __init__(
        self,
        *,
        cwd: Path | str | None = None,
        env: dict[str, str] | None = None,
        grace: float = 10.0,
    ) -> None:
        self.cwd = cwd
        self.env = env
        self.grace = grace
        self.running: list[ManagedProcess] = []

    def start(
        self, argv: list[str], log: Path | None = None, **options: Any
    ) -> subprocess.Popen[bytes]:
        options = {"cwd": self.cwd, "env": self.env, "grace": self.grace, **options}
        managed = ManagedProcess(argv, log=log, new_session=True, **options).start()
        self.running.append(managed)
        return managed.running

    def stop(self, process: subprocess.Popen[Any]) -> None:
        for managed in [m for m in self.running if m.process is process]:
            managed.stop()
            self.running.remove(managed)

    def stop_all(self) -> None:
        stop_together(self.running, self.grace)
        self.running.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop_all()


def stop_together(processes: Sequence[ManagedProcess], grace: float) -> None:
    """Stop ``processes`` (in the order they were started) as one stack: SIGTERM to each,
    newest first, ``grace`` seconds for all of them together, then SIGKILL to what is left
    of each (its whole group with ``new_session``, even after the leader has exited)."""
    for managed in reversed(processes):
        managed.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for managed in processes:
        if managed.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                managed.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        managed.kill_group()
