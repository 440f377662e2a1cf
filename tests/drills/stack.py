"""A private control-plane stack for the outage drills: its own PostgreSQL cluster (in a
temp dir, run as the ``postgres`` user), its own redis-server, the ASGI app under uvicorn,
a Celery ``routers`` worker that supervises a managed router, and the live publisher.
Nothing here touches the machine's shared Postgres or Redis, which other people's tests use.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from devharness import control_plane as cp
from devharness import free_ports, start_process, stop_process, wait_until
from tests.router.helpers import REPO, PrivateRedis

PG_BIN = Path("/usr/lib/postgresql/15/bin")
ROUTER_HOST = "drillhost"
SECRET_KEY = "drill-secret-key-0123456789abcdefghijklmnopqrstuvwxyz"
OPERATOR_PASSWORD = "drill-operator-pass-1"
BIN = Path(sys.executable).parent
SEED = """
import json
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from controlplane.services import clusters, policies, router_deployments, tokens
from controlplane.services.audit import Actor
actor = Actor.system("drills")
spec = json.loads({spec!r})
cluster = clusters.create_cluster(actor, name="drillcp", model=spec["model"], gpu_type="h20")
for k, url in enumerate(spec["urls"]):
    clusters.add_instance(actor, cluster.pk, name=f"i{{k}}", url=url, reason="drill")
policy = policies.create_policy(actor, cluster.pk, name="lm", kind="lmetric")
policies.activate_policy(actor, cluster.pk, policy.pk, reason="drill")
_, deployment = router_deployments.create_router_deployment(
    actor, cluster.pk, name="r0", host="{host}", port=spec["router_port"])
user = get_user_model().objects.create_user("drill-op", password=spec["password"])
user.groups.add(Group.objects.get_or_create(name="operator")[0])
api_token, _ = tokens.create_api_token(actor, user, "drills")
print("SEED" + json.dumps({{"cluster": cluster.pk, "deployment": deployment.pk,
                           "api_token": api_token}}))
"""


def _as_postgres(*args: str, cwd: str = "/") -> subprocess.CompletedProcess[str]:
    prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    return subprocess.run(
        [*prefix, *args], check=True, capture_output=True, text=True, cwd=cwd, timeout=120
    )


@dataclass
class PrivatePostgres:
    port: int
    root: Path

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/switchyard"

    def init(self) -> None:
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        _as_postgres(
            str(PG_BIN / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
        )
        self.start()
        _as_postgres(
            str(PG_BIN / "createdb"),
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-U",
            "postgres",
            "switchyard",
        )

    def start(self) -> None:
        _as_postgres(
            str(PG_BIN / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.root / "pg.log"),
            "-w",
            "-o",
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1",
            "start",
        )

    def stop(self) -> None:
        _as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")

    def destroy(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):  # already stopped
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@dataclass
class Stack:
    root: Path
    postgres: PrivatePostgres
    redis: PrivateRedis
    cp_port: int
    router_port: int
    env: dict[str, str]
    seed: dict[str, Any] = field(default_factory=dict)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def cp_url(self) -> str:
        return f"http://127.0.0.1:{self.cp_port}"

    @property
    def router_url(self) -> str:
        return f"http://127.0.0.1:{self.router_port}"

    @property
    def api_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.seed['api_token']}"}

    def log(self, name: str) -> Path:
        return self.root / f"{name}.log"

    def manage(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        if done.returncode:
            raise RuntimeError(f"manage.py {args[0]} failed: {done.stderr[-2000:]}")
        return done.stdout

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        process = start_process(argv, cwd=self.root, env=self.env, log=self.log(name))
        self.processes[name] = process
        return process

    def start_web(self) -> None:
        process = self.spawn("web", cp.web_command(self.cp_port, log_level="info"))
        wait_until(
            lambda: httpx.get(self.cp_url + "/healthz", timeout=2).status_code < 500,
            60,
            "control plane",
            process,
        )

    def stop_web(self) -> None:
        stop_process(self.processes.pop("web"))

    def start_routers_worker(self) -> None:
        queues = cp.routers_queues(ROUTER_HOST)
        self.spawn(
            "routers-worker",
            cp.worker_command(queues, "drill-routers", solo=True, supervise_routers=True),
        )
        wait_until(
            lambda: httpx.get(self.router_url + "/health", timeout=1).status_code == 200,
            120,  # a Celery worker, then the router it starts, on a loaded 2-core machine
            "supervised router to serve",
        )

    def start_publisher(self) -> None:
        self.spawn("publisher", cp.publisher_command())

    def api(self, path: str) -> httpx.Response:
        return httpx.get(self.cp_url + "/api/v1" + path, headers=self.api_headers, timeout=5)

    def router_info(self) -> dict[str, Any]:
        """The managed router's deployment as the control plane's API reports it."""
        response = self.api(f"/routers/{self.seed['deployment']}")
        response.raise_for_status()
        return response.json()

    def start_ingest(self) -> None:
        """The general worker and beat: ingest of the router streams runs as in production."""
        if "worker" not in self.processes:
            self.spawn("worker", cp.worker_command("default", "drill-default", log_level="WARNING"))
        if "beat" not in self.processes:
            self.spawn("beat", cp.beat_command(self.root / "beat-schedule", log_level="WARNING"))

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in self.root.glob("**/*.log"))

    def close(self) -> None:
        for name in reversed(list(self.processes)):
            stop_process(self.processes.pop(name))
        self.redis.stop()
        self.postgres.destroy()
        shutil.rmtree(self.root, ignore_errors=True)


def build_stack(engine_urls: list[str]) -> Stack:
    """Start everything; the caller must ``close()`` it."""
    root = Path(tempfile.mkdtemp(prefix="sy-drill-stack-"))
    root.chmod(0o755)
    pg_root = Path(tempfile.mkdtemp(prefix="sy-drill-pg-"))
    postgres = PrivatePostgres(free_ports(1), pg_root)
    redis = PrivateRedis(free_ports(1), str(root))
    cp_port, router_port = free_ports(1), free_ports(1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD_")}
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "controlplane.settings",
            "PYTHONPATH": str(REPO),
            "PYTHONUNBUFFERED": "1",
            "SWITCHYARD_DATABASE_URL": postgres.url,
            "SWITCHYARD_REDIS_URL": redis.url,
            "SWITCHYARD_SECRET_KEY": SECRET_KEY,
            "SWITCHYARD_CONTROL_PLANE_URL": f"http://127.0.0.1:{cp_port}",
            "SWITCHYARD_ROUTER_HOST": ROUTER_HOST,
            "SWITCHYARD_VAR_DIR": str(root / "var"),
            "SWITCHYARD_CHANNEL_PREFIX": "drill:asgi",
        }
    )
    stack = Stack(root, postgres, redis, cp_port, router_port, env)
    try:
        postgres.init()
        redis.start()
        stack.manage("migrate", "--noinput")
        spec = json.dumps(
            {
                "model": "Qwen/Qwen2-7B-Instruct",
                "urls": engine_urls,
                "router_port": router_port,
                "password": OPERATOR_PASSWORD,
            }
        )
        out = stack.manage("shell", "-c", SEED.format(spec=spec, host=ROUTER_HOST))
        stack.seed = json.loads(out.split("SEED", 1)[1])
        stack.start_web()
        stack.start_routers_worker()
    except BaseException:
        stack.close()
        raise
    return stack
