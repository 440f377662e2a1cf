"""Exit when the supervising process dies (managed routers started with --supervisor-pid).

A router whose supervisor was SIGKILLed or OOM-killed would otherwise keep serving a
configuration nobody updates any more (its token is rotated when the supervisor comes back,
so it can no longer fetch config or heartbeat). Two mechanisms, both cheap:

* Linux: ``prctl(PR_SET_PDEATHSIG, SIGTERM)``: the kernel sends SIGTERM the moment the
  parent goes away (uvicorn then stops listening and finishes in-flight requests);
* everywhere: a daemon thread that checks ``os.getppid()`` every second, sends SIGTERM when
  the parent changed, and ends the process outright if the graceful shutdown has not
  finished within ``ORPHAN_GRACE_S``.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time

log = logging.getLogger("router_worker.lifeline")

PR_SET_PDEATHSIG = 1
CHECK_INTERVAL_S = 1.0
ORPHAN_GRACE_S = 10.0


def bind_to_parent(supervisor_pid: int) -> None:
    """Arrange to exit when `supervisor_pid` (our parent) dies; exit now if it already has."""
    _set_parent_death_signal()
    if os.getppid() != supervisor_pid:  # it died before (or while) we set this up
        log.error("supervisor %d is gone; not starting", supervisor_pid)
        sys.exit(3)
    threading.Thread(target=_watch, args=(supervisor_pid,), name="lifeline", daemon=True).start()


def _set_parent_death_signal() -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # the process's own symbols, libc included
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            log.warning("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
    except (OSError, AttributeError) as error:  # the watchdog thread still covers us
        log.warning("parent-death signal unavailable: %s", error)


def _watch(supervisor_pid: int) -> None:
    while os.getppid() == supervisor_pid:
        time.sleep(CHECK_INTERVAL_S)
    log.error("supervisor %d died; shutting down (no orphaned router)", supervisor_pid)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(ORPHAN_GRACE_S)
    log.error("graceful shutdown took over %.0f s; exiting", ORPHAN_GRACE_S)
    os._exit(1)
