"""One harness for the processes the tests, the benches and the demo start: free loopback
ports, waiting for a condition or an HTTP endpoint, and subprocesses that are always stopped.

Development tooling only: ``router_worker`` and ``enginesim`` never import it.
"""

from devharness.ports import free_port, free_ports, ports_free
from devharness.processes import (
    ManagedProcess,
    ProcessExited,
    ProcessSet,
    start_process,
    stop_process,
    stop_together,
)
from devharness.waits import TRANSIENT, WaitTimeout, wait_http, wait_until, wait_until_async

__all__ = [
    "TRANSIENT",
    "ManagedProcess",
    "ProcessExited",
    "ProcessSet",
    "WaitTimeout",
    "free_port",
    "free_ports",
    "ports_free",
    "start_process",
    "stop_process",
    "stop_together",
    "wait_http",
    "wait_until",
    "wait_until_async",
]
