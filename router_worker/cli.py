"""``python -m router_worker``: run one router process (standalone or managed).

Standalone::

    python -m router_worker --config router.json --port 8000 [--admin-token T]

Managed (configuration from the control plane)::

    python -m router_worker --control-plane http://cp:8080 --deployment 7 --token T

Replica sync (``router.peer_sync``) signs and verifies with the cluster's key, read from
the environment only (``SWITCHYARD_PEER_KEY``, older keys in
``SWITCHYARD_PEER_KEY_PREVIOUS``); a router without one serves alone, unsynced.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import resource
import socket
import sys
import time
from pathlib import Path

import uvicorn

from router_worker import lifeline, tracing
from router_worker.app import RouterApp
from router_worker.config_source import ManagedConfig
from router_worker.connections import guarded_protocol
from router_worker.contract.telemetry import (
    PEER_KEY_ENV,
    PEER_KEY_PREVIOUS_ENV,
    REDIS_URL_ENV,
    ROUTER_TOKEN_ENV,
)
from router_worker.peers import PeerKeys
from router_worker.priority import set_niceness
from router_worker.service import ConfigRefused, Service, ServiceOptions

DEFAULT_REDIS = "redis://127.0.0.1:6379/0"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m router_worker", description="Switchyard request router (data plane)."
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", type=Path, help="standalone: RouterConfig JSON file")
    source.add_argument("--control-plane", metavar="URL", help="managed: control plane URL")
    parser.add_argument("--deployment", help="managed: RouterDeployment id")
    parser.add_argument(
        "--token",
        default=os.environ.get(ROUTER_TOKEN_ENV),
        help=f"managed: router token (env {ROUTER_TOKEN_ENV})",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--name", help="router name in telemetry (default hostname:port)")
    parser.add_argument(
        "--redis-url",
        default=os.environ.get(REDIS_URL_ENV),
        help="telemetry and config notices; 'none' disables (default: env "
        f"{REDIS_URL_ENV}; managed mode falls back to {DEFAULT_REDIS})",
    )
    parser.add_argument(
        "--admin-token",
        default=os.environ.get("SWITCHYARD_ROUTER_ADMIN_TOKEN"),
        help="token for /admin (env SWITCHYARD_ROUTER_ADMIN_TOKEN)",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=Path("var/router"),
        help="managed: where the last good config is kept",
    )
    parser.add_argument(
        "--poll-interval", type=float, default=10.0, help="managed: config poll fallback, seconds"
    )
    parser.add_argument("--heartbeat-interval", type=float, default=5.0)
    parser.add_argument(
        "--supervisor-pid",
        type=int,
        metavar="PID",
        help="managed: exit when this process (the parent) dies",
    )
    parser.add_argument("--log-level", default=os.environ.get("SWITCHYARD_LOG_LEVEL", "INFO"))
    parser.add_argument(
        "--nice",
        type=int,
        metavar="N",
        help="run at niceness N (e.g. -10: priority over other work on a shared host; "
        "below the current value needs CAP_SYS_NICE or RLIMIT_NICE)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="FILE",
        help="debug: run under cProfile and write the stats to FILE on exit",
    )
    return parser


def _redis_url(args: argparse.Namespace) -> str | None:
    url = args.redis_url
    if url is None:
        return DEFAULT_REDIS if args.control_plane else None
    return None if url.lower() in ("", "none", "off") else url


def tune_gc() -> None:
    """Keep the cyclic GC off the hot path: the objects alive at start-up (modules, numpy,
    pydantic, the configuration) move to the permanent generation so full collections do
    not walk them again and again, and young collections run every 20 000 allocations
    instead of 700 (requests allocate a few hundred objects, nearly all freed by
    reference counting). Was ~3.5% of the router's CPU under load."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


def raise_fd_limit() -> None:
    """Soft RLIMIT_NOFILE up to the hard limit: every client and every engine connection
    is a file descriptor, and a default soft limit of 1024 would cap the router at ~500
    connections (``router.max_connections`` never exceeds half the limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def take_priority(niceness: int) -> bool:
    """Every thread of this process at ``niceness``, before the service starts its threads.
    A router on a host it shares waits for a CPU behind the other work there, and every
    request waits with it: past 64 streams on a busy 2-core host most of the latency it
    added was that wait (bench/router_overhead/sidebyside-nice.md). False, with a warning,
    if the system refuses: the router then runs at the priority it was started with."""
    if set_niceness(os.getpid(), niceness):
        return True
    logging.getLogger("router_worker").warning(
        "--nice %d: not permitted (needs CAP_SYS_NICE or RLIMIT_NICE); running at nice %d",
        niceness,
        os.getpriority(os.PRIO_PROCESS, 0),
    )
    return False


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    for noisy in ("httpx", "httpcore"):  # one line per upstream call would cost the hot path
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if args.control_plane and not (args.deployment and args.token):
        parser.error("--control-plane needs --deployment and --token")
    if args.nice is not None:
        take_priority(args.nice)
    if args.supervisor_pid is not None:
        lifeline.bind_to_parent(args.supervisor_pid)
    name = args.name or f"{socket.gethostname()}:{args.port}"
    try:
        tracing.setup()
    except (ImportError, ValueError) as error:  # the tracing extra missing, an unknown exporter
        print(f"router_worker: tracing asked for by OTEL_* but: {error}", file=sys.stderr)
        return 2
    try:
        peer_keys = PeerKeys.from_environment(
            os.environ.get(PEER_KEY_ENV), os.environ.get(PEER_KEY_PREVIOUS_ENV)
        )
    except ValueError as error:
        print(f"router_worker: {PEER_KEY_ENV}: {error}", file=sys.stderr)
        return 2
    service = Service(
        ServiceOptions(
            name=name,
            redis_url=_redis_url(args),
            admin_token=args.admin_token or None,
            peer_keys=peer_keys,
        )
    )
    if args.config is not None:
        try:
            service.apply_document(json.loads(args.config.read_text()), source="file")
        except (OSError, ValueError, ConfigRefused) as error:
            print(f"router_worker: cannot use {args.config}: {error}", file=sys.stderr)
            return 2
        app = RouterApp(service)
    else:
        managed = ManagedConfig(
            service,
            args.control_plane,
            args.deployment,
            args.token,
            args.state_dir,
            args.poll_interval,
            args.heartbeat_interval,
        )
        app = RouterApp(service, on_start=managed.bootstrap)
    # proxy_headers off: nothing reads the client address, and the middleware costs a
    # frame and a header scan per request.
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        loop="uvloop",
        lifespan="on",
        access_log=False,
        log_level=args.log_level.lower(),
        timeout_keep_alive=30,
        http=guarded_protocol(service.connections),
        backlog=4096,
        proxy_headers=False,
    )
    tune_gc()
    raise_fd_limit()
    server = uvicorn.Server(config)
    if args.profile is None:
        try:
            server.run()
        finally:
            tracing.shutdown()
        return 0
    import cProfile

    profiler = cProfile.Profile(time.process_time)  # CPU time: the machine may be shared
    try:
        profiler.runcall(server.run)
    except KeyboardInterrupt:  # the profiler's frame sees the Ctrl-C uvicorn handled
        pass
    finally:
        profiler.dump_stats(str(args.profile))
    return 0
