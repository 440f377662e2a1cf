"""Managed mode: configuration from the control plane, with a last-good copy on disk.

Contract (paths kept here, in one place)::

    GET  {cp}/api/v1/routers/{deployment}/config      Authorization: Bearer <token>
         → 200 {"version": N, "document": {...RouterConfig...}}   (404/503: none yet)
    POST {cp}/api/v1/routers/{deployment}/heartbeat   same header
         ← {"applied_version": N, "state": {...small summary...}}
    Redis pub/sub channel ``switchyard:config``: {"cluster": name, "version": N}

Behaviour: at start, fetch; if the control plane is unreachable, start from the last
applied configuration saved on disk (``--state-dir``), else serve 503 until one arrives.
Then a pub/sub listener fetches as soon as a newer version of our cluster is announced,
a poll loop fetches every ``poll_interval_s`` as a fallback (pub/sub messages are lost
while Redis is down), and a heartbeat reports the applied version. A refused document
(invalid) leaves the old configuration in force; the refusal is an event.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import httpx

from router_worker.contract.config import RouterConfig
from router_worker.contract.telemetry import CONFIG_CHANNEL
from router_worker.service import ConfigRefused, Service
from router_worker.upstream import AcyclicClient

log = logging.getLogger("router_worker.contract.config")

CONFIG_PATH = "/api/v1/routers/{deployment}/config"
HEARTBEAT_PATH = "/api/v1/routers/{deployment}/heartbeat"
FETCH_TIMEOUT_S = 3.0


class ManagedConfig:
    def __init__(
        self,
        service: Service,
        control_plane: str,
        deployment: str,
        token: str,
        state_dir: Path,
        poll_interval_s: float = 10.0,
        heartbeat_interval_s: float = 5.0,
    ) -> None:
        self.service = service
        self.base = control_plane.rstrip("/")
        self.deployment = deployment
        self.headers = {"Authorization": f"Bearer {token}"}
        self.state_file = state_dir / f"router-config-{_safe(deployment)}.json"
        self.poll_interval_s = poll_interval_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.client = AcyclicClient(timeout=FETCH_TIMEOUT_S, trust_env=False)
        self.last_error: str | None = None
        service.on_applied.append(self._save)

    # ----- start -----------------------------------------------------------------------
    async def bootstrap(self, service: Service) -> None:
        """Called before serving: control plane first, the disk copy if that fails."""
        if not await self.fetch():
            self._start_from_disk()
        service.add_task(self.run_poll())
        service.add_task(self.run_heartbeat())
        if service.options.redis_url:
            service.add_task(self.run_pubsub(service.options.redis_url))

    def _start_from_disk(self) -> None:
        saved = self._load_saved()
        if saved is None:
            log.warning("no configuration yet (control plane: %s); answering 503", self.last_error)
            return
        try:
            self.service.apply_document(saved, source="disk")
            log.warning(
                "control plane unreachable (%s); serving last good config v%s",
                self.last_error,
                saved.get("version"),
            )
        except ConfigRefused as error:
            log.error("saved config refused: %s", error)

    async def fetch(self) -> bool:
        """GET the current version and apply it when newer; True if one is applied."""
        url = self.base + CONFIG_PATH.format(deployment=self.deployment)
        try:
            response = await self.client.get(url, headers=self.headers)
        except httpx.HTTPError as error:
            self.last_error = f"{type(error).__name__}: {error}"
            return False
        if response.status_code != 200:
            self.last_error = f"HTTP {response.status_code}"
            return self.service.core.runtime is not None
        try:
            payload = response.json()
            version, document = int(payload["version"]), payload["document"]
        except (ValueError, KeyError, TypeError) as error:
            self.last_error = f"bad config response: {error}"
            return False
        runtime = self.service.core.runtime
        if runtime is not None and version <= runtime.version:
            return True
        try:
            self.service.apply_document(document, version, source="control_plane")
        except ConfigRefused as error:
            self.last_error = f"version {version} refused: {error}"
            log.error("config %s", self.last_error)
        return self.service.core.runtime is not None

    # ----- loops -----------------------------------------------------------------------
    async def run_poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval_s)
            await self.fetch()

    async def run_heartbeat(self) -> None:
        url = self.base + HEARTBEAT_PATH.format(deployment=self.deployment)
        while True:
            runtime = self.service.core.runtime
            body = {
                "applied_version": runtime.version if runtime else None,
                "state": heartbeat_state(self.service, self.last_error),
            }
            try:
                await self.client.post(url, headers=self.headers, json=body)
            except httpx.HTTPError as error:
                log.debug("heartbeat failed: %r", error)
            await asyncio.sleep(self.heartbeat_interval_s)

    async def run_pubsub(self, redis_url: str) -> None:
        import redis.asyncio as aioredis

        while True:
            client = aioredis.Redis.from_url(redis_url, socket_connect_timeout=1.0)
            try:
                pubsub = client.pubsub()
                await pubsub.subscribe(CONFIG_CHANNEL)
                async for message in pubsub.listen():
                    if message.get("type") == "message" and self._announces_newer(
                        message.get("data")
                    ):
                        await self.fetch()
            except Exception as error:  # Redis down: the poll loop covers us; retry later
                log.debug("config pub/sub unavailable: %r", error)
            finally:
                await client.aclose()
            await asyncio.sleep(2.0)

    def _announces_newer(self, data: Any) -> bool:
        try:
            notice = json.loads(data)
            version = int(notice["version"])
        except (ValueError, KeyError, TypeError):
            return False
        runtime = self.service.core.runtime
        if runtime is None:
            return True
        return notice.get("cluster") == runtime.config.cluster and version > runtime.version

    # ----- last good config on disk ----------------------------------------------------
    def _save(self, config: RouterConfig, document: dict[str, Any]) -> None:
        try:
            self.state_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.state_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(config.model_dump(mode="json")))
            os.replace(tmp, self.state_file)
        except OSError as error:
            log.warning("cannot save config to %s: %s", self.state_file, error)

    def _load_saved(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return None

    async def close(self) -> None:
        await self.client.aclose()


def heartbeat_state(service: Service, last_error: str | None = None) -> dict[str, Any]:
    core = service.core
    return {
        "router": service.options.name,
        "pid": os.getpid(),
        "uptime_s": round(time.time() - service.started_at, 1),
        "instances": {name: core.health.effective(name) for name in core.health.instances},
        "in_flight": service.limiter.active,
        "queued": service.limiter.queued,
        "redis": service.telemetry.connected,
        "events_buffered": service.telemetry.buffered_events,
        "events_dropped": service.telemetry.dropped_total,
        "config_error": last_error,
    }


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
