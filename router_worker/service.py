"""Wiring of one router process: core, ingress, monitor, telemetry, config; start and stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.cookiejar import CookieJar
from typing import Any

import httpx

from router_worker.connections import ConnectionGuard
from router_worker.contract.config import ConfigError, RouterConfig, parse_config
from router_worker.core import RouterCore
from router_worker.ingress import Ingress
from router_worker.intake import IntakeRunner
from router_worker.kv_subscriber import KVSubscribers
from router_worker.limits import Limiter
from router_worker.metrics import RouterMetrics
from router_worker.monitor import Monitor
from router_worker.peers import PeerKeys, PeerSync
from router_worker.quota import SharedQuota
from router_worker.telemetry import Telemetry
from router_worker.upstream import AcyclicClient, FastTransport

log = logging.getLogger("router_worker")


@dataclass
class ServiceOptions:
    name: str
    redis_url: str | None = None
    admin_token: str | None = None
    peer_keys: PeerKeys | None = None  # replica sync signs and verifies with these
    max_idle_per_origin: int = 1024


class ConfigRefused(Exception):
    """A configuration document was refused (invalid, or older than the applied one)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Service:
    options: ServiceOptions
    metrics: RouterMetrics = field(default_factory=RouterMetrics)
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    on_applied: list[Callable[[RouterConfig, dict[str, Any]], None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.unwatch_gc: Callable[[], None] = lambda: None
        self.telemetry = Telemetry(
            self.options.name,
            self.options.redis_url,
            on_dropped=lambda n: self.metrics.telemetry_dropped.inc(n),
        )
        self.core = RouterCore(self.options.name, self.telemetry, self.metrics)
        self.core.flow.quota = SharedQuota(self.options.redis_url)
        self.limiter = Limiter(1024, 1024, 10.0)
        self.connections = ConnectionGuard(self.metrics)
        self.transport = FastTransport(self.options.max_idle_per_origin)
        self.client = make_client(self.transport)
        intake = IntakeRunner(metrics=self.metrics)
        self.ingress = Ingress(self.core, self.transport, self.limiter, intake)
        self.monitor = Monitor(self.core, self.client)
        self.kv = KVSubscribers(self.core)
        self.peers = PeerSync(
            self.options.name,
            self.options.redis_url,
            self.metrics,
            lambda: self.core.state,
            self.options.peer_keys,
        )
        self.core.peers = self.peers
        self.started_at = time.time()

    # ----- configuration -------------------------------------------------------------
    def apply_document(
        self, document: dict[str, Any], version: int | None = None, source: str = "admin"
    ) -> RouterConfig:
        """Validate and apply; raises ConfigRefused (old config kept) if it cannot be."""
        if version is not None:
            document = {**document, "version": version}
        try:
            config = parse_config(document)
        except ConfigError as error:
            self.telemetry.event(
                "config_rejected", version=document.get("version"), error=str(error), source=source
            )
            raise ConfigRefused(str(error)) from None
        current = self.core.runtime
        if current is not None and config.version < current.version:
            message = f"version {config.version} is older than the applied {current.version}"
            self.telemetry.event(
                "config_rejected", version=config.version, error=message, source=source
            )
            raise ConfigRefused(message, status=409)
        if current is not None and current.config == config:
            return config
        try:
            self.core.apply_config(config)
        except (OSError, ValueError) as error:  # e.g. tokenizer file unreadable
            self.telemetry.event(
                "config_rejected", version=config.version, error=str(error), source=source
            )
            raise ConfigRefused(f"cannot apply: {error}") from None
        settings = config.router
        self.limiter.configure(
            settings.max_concurrency, settings.max_queue, settings.queue_timeout_s
        )
        self.connections.configure(
            settings.max_connections, settings.header_timeout_s, settings.body_timeout_s
        )
        self.transport.configure(settings.max_response_header_bytes, settings.max_response_bytes)
        self.kv.sync(config)
        self.peers.configure(config)
        self.telemetry.event(
            "config_applied",
            version=config.version,
            source=source,
            policy=config.policy.kind,
            canary=config.canary.id if config.canary else None,
        )
        log.info(
            "applied config version %s (%s, %d instances) from %s",
            config.version,
            config.policy.kind,
            len(config.instances),
            source,
        )
        for hook in self.on_applied:
            hook(config, document)
        return config

    # ----- start and stop --------------------------------------------------------------
    async def start(self) -> None:
        self.telemetry.event(
            "router_started",
            pid=os.getpid(),
            config_version=self.core.runtime.version if self.core.runtime else None,
        )
        for loop in (
            self.monitor.run_scrapes(),
            self.monitor.run_probes(),
            self.telemetry.run(),
            self.kv.run(),
            self.peers.run(),
            self.core.metrics.sample_loop_lag(),
        ):
            self.tasks.append(asyncio.create_task(loop))
        self.unwatch_gc = self.core.metrics.watch_gc()

    def add_task(self, coroutine: Any) -> None:
        self.tasks.append(asyncio.create_task(coroutine))

    async def stop(self) -> None:
        self.unwatch_gc()
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.kv.close()
        self.ingress.intake.close()
        await self.peers.close()
        await self.client.aclose()
        await self.telemetry.close()
        await self.core.flow.quota.close()


def make_client(transport: FastTransport) -> httpx.AsyncClient:
    """The one shared upstream client, on the O(1) keep-alive transport (see upstream.py)."""
    return AcyclicClient(
        transport=transport,
        timeout=httpx.Timeout(30.0),
        follow_redirects=False,
        trust_env=False,
        cookies=_NoCookies(),
    )


class _NoCookies(CookieJar):
    """Engines set no cookies; skipping httpx's per-response cookie parsing saves CPU."""

    def extract_cookies(self, response: Any, request: Any) -> None:
        return None

    def add_cookie_header(self, request: Any) -> None:
        return None
