"""The Celery worker bootstep that runs a RouterSupervisor inside a `routers` worker.

Enabled with `celery -A controlplane worker -Q routers -P solo --supervise-routers`. Each
router host runs one such worker; the host name it claims deployments for comes from
SWITCHYARD_ROUTER_HOST (default: this machine's host name).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from celery import bootsteps

if TYPE_CHECKING:
    from .supervisor import RouterSupervisor


def router_host() -> str:
    return os.environ.get("SWITCHYARD_ROUTER_HOST", socket.gethostname())


def host_queue(host: str) -> str:
    return f"routers.{host}"


class RouterSupervisorStep(bootsteps.StartStopStep):
    requires = {"celery.worker.components:Pool"}

    def __init__(self, worker, supervise_routers: bool = False, **options) -> None:
        super().__init__(worker, **options)
        self.enabled = bool(supervise_routers)
        self.supervisor: RouterSupervisor | None = None

    def start(self, worker) -> None:
        # Imported here: this module is loaded with the Celery app, before Django's apps.
        from django.conf import settings

        from . import supervisor

        self.supervisor = supervisor.RouterSupervisor(
            host=router_host(),
            control_plane_url=settings.SWITCHYARD_CONTROL_PLANE_URL,
            log_dir=Path(settings.SWITCHYARD_VAR_DIR) / "log",
            pid_dir=Path(settings.SWITCHYARD_VAR_DIR) / "run",
        )
        supervisor.install(self.supervisor)
        self.supervisor.start()

    def stop(self, worker) -> None:
        from . import supervisor

        if self.supervisor is not None:
            self.supervisor.stop()
            supervisor.install(None)
