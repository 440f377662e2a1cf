"""One simulated vLLM instance: engine core + driver + metrics + KV events + HTTP server."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import uvicorn

from engine_interface.kv_events import AllBlocksCleared
from enginesim.server.chat import ChatTemplate, model_template
from enginesim.server.disagg import SideChannel
from enginesim.server.driver import EngineDriver, VirtualClock
from enginesim.server.faults import FaultRequest, FaultState
from enginesim.server.kv_events import KVEventPublisher
from enginesim.server.metrics import ServerMetrics
from enginesim.server.request_log import RequestLog

log = logging.getLogger(__name__)

# Once a kill is requested, in-flight handlers get this long to cut their
# connections before uvicorn cancels them.
KILL_GRACE_SECONDS = 0.05


@dataclass(frozen=True)
class InstanceSettings:
    index: int
    host: str
    port: int
    time_scale: float
    stream_interval: int = 1
    role: str = "both"  # prefill | decode | both (enginesim.server.disagg)
    kv_connector: bool = False  # disaggregation is on: export the transfer metrics


class QuietServer(uvicorn.Server):
    """A uvicorn server that leaves signal handling to the process (many share a loop)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class Instance:
    """Everything behind one port. ``engine_factory(kv_sink)`` builds a fresh engine core."""

    def __init__(
        self,
        settings: InstanceSettings,
        engine_config: Any,
        engine_factory: Callable[[Callable[[list[Any]], None] | None], Any],
        kv_publisher: KVEventPublisher | None = None,
        request_log: RequestLog | None = None,
        chat_template: ChatTemplate | None = None,
    ) -> None:
        self.settings = settings
        self.chat_template = chat_template or model_template(engine_config.model.key)
        self.request_log = request_log
        self.engine_config = engine_config
        self.served_name: str = engine_config.model.served_name
        self.max_model_len: int = engine_config.max_model_len
        self._engine_factory = engine_factory
        self.kv_publisher = kv_publisher
        self.faults = FaultState()
        self.clock = VirtualClock(settings.time_scale)
        self.side_channel = SideChannel()
        self.engine_id = ""
        self.driver: EngineDriver = self._boot()
        self._server: uvicorn.Server | None = None
        self._server_task: asyncio.Task[None] | None = None
        self._stopping: asyncio.Future[None] | None = None
        self.app: Any = None

    @property
    def engine(self) -> Any:
        return self.driver.engine

    @property
    def metrics(self) -> ServerMetrics:
        return self.driver.metrics

    def cache_info(self) -> dict[str, str]:
        """Labels of ``vllm:cache_config_info`` (a subset of vLLM's CacheConfig fields)."""
        cfg = self.engine_config
        return {
            "block_size": str(cfg.block_size),
            "cache_dtype": "auto" if cfg.kv_dtype == cfg.dtype else cfg.kv_dtype,
            "enable_prefix_caching": str(cfg.enable_prefix_caching),
            "gpu_memory_utilization": str(cfg.gpu_memory_utilization),
            "num_cpu_blocks": "None",
            "num_gpu_blocks": str(cfg.num_gpu_blocks),
        }

    def _boot(self) -> EngineDriver:
        sink = self.kv_publisher.publish if self.kv_publisher is not None else None
        engine = self._engine_factory(sink)
        # vLLM's engine id is a fresh UUID per start: a restarted instance's holds are gone,
        # and a read naming its former id fails.
        self.engine_id = uuid.uuid4().hex
        metrics = ServerMetrics(
            self.served_name,
            self.max_model_len,
            self.cache_info(),
            lambda: self.driver.engine.stats(),
            lambda: self.clock.wall_per_virtual,
            kv_connector=self.settings.kv_connector,
        )
        return EngineDriver(engine, self.clock, metrics)

    async def start(self, app: Any) -> None:
        self.app = app
        self.driver.start()
        await self._start_server()

    async def _start_server(self) -> None:
        config = uvicorn.Config(
            self.app,
            host=self.settings.host,
            port=self.settings.port,
            lifespan="off",
            ws="none",
            log_level="warning",
            access_log=False,
            # uvicorn waits with asyncio, any float; its annotation says int
            timeout_graceful_shutdown=KILL_GRACE_SECONDS,  # type: ignore[arg-type]
        )
        server = QuietServer(config)
        sock = config.bind_socket()
        self._server = server
        self._server_task = asyncio.ensure_future(server.serve(sockets=[sock]))
        while not server.started:
            if self._server_task.done():
                self._server_task.result()
                raise RuntimeError(f"instance {self.settings.index} server did not start")
            await asyncio.sleep(0.01)

    async def _stop_server(self) -> None:
        if self._server is None or self._server_task is None:
            return
        self._server.should_exit = True
        await asyncio.gather(self._server_task, return_exceptions=True)
        self._server = None
        self._server_task = None

    async def apply_fault(self, request: FaultRequest) -> None:
        was_killed = self.faults.killed
        if request.mode == "recover" and was_killed:
            await self._restart()
        if was_killed and request.mode != "recover":
            raise ValueError("instance is killed; recover it first")
        self.faults.set(request)
        self.clock.set_wall_per_virtual(self.settings.time_scale * self.faults.factor)
        self.driver.wake()
        if self.faults.killed:
            self.driver.abort_all()
            # Shielded: a kill sent to the instance's own port gets its handler
            # cancelled by the very shutdown it started.
            self._stopping = asyncio.ensure_future(self._stop_server())
            await asyncio.shield(self._stopping)

    async def _restart(self) -> None:
        if self._stopping is not None:
            await self._stopping
        await self.driver.stop()
        if self.kv_publisher is not None:
            self.kv_publisher.publish([AllBlocksCleared()])
        self.driver = self._boot()
        self.driver.start()
        await self._start_server()
        log.warning("instance %d restarted after kill", self.settings.index)

    async def stop(self) -> None:
        await self._stop_server()
        await self.driver.stop()
        await self.side_channel.close()
