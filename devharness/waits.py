"""Waiting for a condition with a deadline, optionally watching a process that must not die."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx

from devharness.processes import ProcessExited

T = TypeVar("T")
# What a server that is still starting raises at a probe (refused connection, reset, ...).
TRANSIENT: tuple[type[BaseException], ...] = (OSError, httpx.HTTPError)


class WaitTimeout(AssertionError):
    """A condition was not reached in time (an AssertionError: in a test, a failure)."""


def _tail(log: Path | None, chars: int = 3000) -> str:
    if log is None:
        return ""
    try:
        return "\n" + log.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def _poller(
    predicate: Callable[[], T | None],
    timeout: float,
    what: str,
    process: subprocess.Popen[Any] | None,
    log: Path | None,
    ignore: tuple[type[BaseException], ...],
) -> Callable[[], T | None]:
    """One attempt of a wait: the predicate's value when truthy, None for "not yet";
    raises ProcessExited or WaitTimeout as :func:`wait_until` documents."""
    deadline = time.monotonic() + timeout

    def attempt() -> T | None:
        if process is not None and process.poll() is not None:
            raise ProcessExited(f"{what}: process exited with {process.returncode}{_tail(log)}")
        try:
            if result := predicate():
                return result
        except ignore:
            pass  # not yet
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout:g} s waiting for {what}{_tail(log)}")
        return None

    return attempt


def wait_until(
    predicate: Callable[[], T | None],
    timeout: float,
    what: str,
    process: subprocess.Popen[Any] | None = None,
    *,
    log: Path | None = None,
    interval: float = 0.05,
    ignore: tuple[type[BaseException], ...] = TRANSIENT,
) -> T:
    """Poll ``predicate`` until it returns something truthy and return that. Exceptions in
    ``ignore`` count as "not yet". Raises ProcessExited as soon as ``process`` exits and
    WaitTimeout after ``timeout`` seconds; both carry the tail of ``log`` when given."""
    attempt = _poller(predicate, timeout, what, process, log, ignore)
    while (result := attempt()) is None:
        time.sleep(interval)
    return result


async def wait_until_async(
    predicate: Callable[[], T | None],
    timeout: float,
    what: str,
    process: subprocess.Popen[Any] | None = None,
    *,
    log: Path | None = None,
    interval: float = 0.05,
    ignore: tuple[type[BaseException], ...] = TRANSIENT,
) -> T:
    """:func:`wait_until` for a coroutine: the event loop runs between the polls (which
    must not block), so the condition can be one that a task of the same loop brings
    about."""
    attempt = _poller(predicate, timeout, what, process, log, ignore)
    while (result := attempt()) is None:
        await asyncio.sleep(interval)
    return result


def wait_http(
    url: str,
    timeout: float,
    *,
    process: subprocess.Popen[Any] | None = None,
    log: Path | None = None,
    ok: Callable[[int], bool] = lambda status: True,
    interval: float = 0.1,
) -> None:
    """Wait until ``url`` answers an HTTP GET whose status satisfies ``ok`` (by default:
    any answer at all)."""
    wait_until(
        lambda: ok(httpx.get(url, timeout=1).status_code),
        timeout,
        url,
        process=process,
        log=log,
        interval=interval,
    )
