"""One harness for the processes the tests, the benches and the demo start: free loopback
ports, waiting for a condition or an HTTP endpoint, subprocesses that are always stopped,
enginesim fleets and router processes.

Development tooling only: ``router_worker`` and ``enginesim`` never import it.
"""

from devharness.fleet import Fleet, scrape_total
from devharness.ports import free_port, free_ports, ports_free
from devharness.processes import (
    ManagedProcess,
    ProcessExited,
    ProcessSet,
    start_process,
    stop_process,
    stop_together,
)
from devharness.routers import Router, router_env, start_router
from devharness.waits import TRANSIENT, WaitTimeout, wait_http, wait_until, wait_until_async

__all__ = [
    "TRANSIENT",
    "Fleet",
    "ManagedProcess",
    "ProcessExited",
    "ProcessSet",
    "Router",
    "WaitTimeout",
    "free_port",
    "free_ports",
    "ports_free",
    "router_env",
    "scrape_total",
    "start_process",
    "start_router",
    "stop_process",
    "stop_together",
    "wait_http",
    "wait_until",
    "wait_until_async",
]
