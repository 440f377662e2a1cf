"""Telemetry-to-browser latency of the live dashboard.

Run: .venv/bin/python -m bench.dashboard_latency.run [--dashboards 1,20] [--seconds 20]

What runs (all real, on this machine): a throw-away Postgres database (migrated, dropped
at the end), the ASGI app under uvicorn, `manage.py run_publisher`, and two fake routers
writing StateSnapshot JSON to Redis every 250 ms with `ts` = write time, exactly as live
routers do. N headless Debian-chromium pages (Playwright) open the cluster's live view.
Each page records, per snapshot message, receive time − router `ts` (end to end) and
receive time − publisher `published_at` (channel layer + browser). Redis database 8 and
its own channel prefix keep it away from `make demo` and the tests.
"""

from __future__ import annotations

import argparse
import os
import platform
import secrets
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from devharness import ProcessSet, free_port, wait_http
from devharness import control_plane as cp
from engine_interface import percentile

if TYPE_CHECKING:
    from controlplane.models import Cluster

ROOT = Path(__file__).resolve().parents[2]
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/8")
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-dev-shm-usage",
    "--disable-background-timer-throttling",
    "--disable-renderer-backgrounding",
    "--disable-backgrounding-occluded-windows",
]
ROUTERS = 2
INSTANCES = 8


def setup_django() -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "controlplane.settings"
    os.environ.setdefault("SWITCHYARD_SECRET_KEY", secrets.token_urlsafe(50))
    os.environ["SWITCHYARD_REDIS_URL"] = REDIS_URL
    os.environ["SWITCHYARD_CHANNEL_PREFIX"] = "switchyard-bench:asgi"
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # Playwright's sync API runs a loop
    import django

    django.setup()


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


class Database:
    """A migrated database of its own, dropped on close."""

    def __init__(self) -> None:
        from django.db import connection

        self.connection = connection
        connection.settings_dict["TEST"] = {
            **connection.settings_dict.get("TEST", {}),
            "NAME": "switchyard_bench",
        }
        self.name = connection.creation.create_test_db(
            verbosity=0, autoclobber=True, serialize=False
        )

    def url(self) -> str:
        db = self.connection.settings_dict
        return f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{self.name}"

    def close(self, original: str) -> None:
        self.connection.creation.destroy_test_db(original, verbosity=0)


def seed() -> tuple[Cluster, str]:
    """A cluster and a viewer's session cookie."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group
    from django.test import Client

    from controlplane.services import clusters, policies
    from controlplane.services.audit import Actor

    actor = Actor.system("bench")
    cluster = clusters.create_cluster(
        actor, name="bench", model="Qwen/Qwen2-7B-Instruct", gpu_type="h20"
    )
    for k in range(INSTANCES):
        clusters.add_instance(
            actor, cluster.pk, name=f"i{k}", url=f"http://127.0.0.1:{9900 + k}", reason="bench"
        )
    policy = policies.create_policy(actor, cluster.pk, name="lm", kind="lmetric")
    policies.activate_policy(actor, cluster.pk, policy.pk, reason="bench")
    user = get_user_model().objects.create_user("bench-viewer", password="bench-password-1")
    user.groups.add(Group.objects.get_or_create(name="viewer")[0])
    client = Client()
    client.force_login(user)
    return cluster, client.cookies["sessionid"].value


class Routers:
    """Fake routers: a StateSnapshot per router every 250 ms, phases spread like real ones."""

    def __init__(self, cluster_name: str) -> None:
        import redis

        self.client = redis.Redis.from_url(REDIS_URL)
        self.cluster = cluster_name
        self.stopped = threading.Event()
        self.threads = [
            threading.Thread(target=self._run, args=(n,), daemon=True) for n in range(ROUTERS)
        ]

    def _run(self, n: int) -> None:
        from router_worker.contract.telemetry import (
            STATE_INTERVAL_S,
            STATE_TTL_S,
            InstanceSnapshot,
            StateSnapshot,
            WindowStats,
            dumps_state,
            state_key,
        )

        rng = np.random.default_rng(n)
        time.sleep(STATE_INTERVAL_S * n / ROUTERS)
        while not self.stopped.is_set():
            started = time.time()
            instances = [
                InstanceSnapshot(
                    name=f"i{k}",
                    health="healthy",
                    pending_prefill_tokens=float(rng.integers(5000)),
                    pending_prefill_tokens_max=float(rng.integers(5000, 9000)),
                    batch_size=float(rng.integers(32)),
                    batch_size_max=32.0,
                    in_flight=int(rng.integers(40)),
                    kv_usage=float(rng.random()),
                )
                for k in range(INSTANCES)
            ]
            window = WindowStats(
                seconds=30,
                requests=900,
                errors=0,
                requests_per_s=30,
                output_tokens_per_s=4000,
                ttft_p50_s=0.05,
                ttft_p99_s=0.4,
                tpot_p50_s=0.01,
                tpot_p99_s=0.03,
                hit_ratio=0.6,
                load_cv=0.3,
            )
            snapshot = StateSnapshot(
                ts=time.time(),
                cluster=self.cluster,
                router=f"r{n}",
                config_version=1,
                policy="lmetric",
                instances=instances,
                window=window,
            )
            self.client.set(state_key(self.cluster, f"r{n}"), dumps_state(snapshot), ex=STATE_TTL_S)
            self.stopped.wait(max(0.0, STATE_INTERVAL_S - (time.time() - started)))

    def __enter__(self) -> Routers:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        for thread in self.threads:
            thread.join(timeout=5)
        self.client.close()


def measure(
    browser, base: str, cluster_id: int, session: str, dashboards: int, seconds: float
) -> tuple[list[float], list[float]]:
    context = browser.new_context(bypass_csp=True)  # wait_for_function evaluates strings
    context.add_cookies([{"name": "sessionid", "value": session, "url": base}])
    pages = [context.new_page() for _ in range(dashboards)]
    try:
        for page in pages:
            page.goto(f"{base}/clusters/{cluster_id}/")
        for page in pages:
            page.wait_for_function(
                "window.switchyardLive && window.switchyardLive.messages > 4", timeout=30_000
            )
            page.evaluate(
                "window.switchyardLive.latencies.length = 0;"
                "window.switchyardLive.deliveries.length = 0"
            )
        time.sleep(seconds)
        end_to_end, delivery = [], []
        for page in pages:
            sample = page.evaluate(
                "[window.switchyardLive.latencies, window.switchyardLive.deliveries]"
            )
            end_to_end += sample[0]
            delivery += sample[1]
        return end_to_end, delivery
    finally:
        context.close()


def measure_sockets(
    base: str, cluster_id: int, session: str, dashboards: int, seconds: float
) -> tuple[list[float], list[float]]:
    """The same with plain websocket clients (no rendering): the server side alone."""
    import asyncio
    import json

    import websockets

    async def client(samples: tuple[list[float], list[float]]) -> None:
        url = base.replace("http", "ws", 1) + f"/ws/clusters/{cluster_id}/"
        headers = {"Cookie": f"sessionid={session}", "Origin": base}
        async with websockets.connect(url, additional_headers=headers) as socket:
            deadline = time.time() + seconds
            while (left := deadline - time.time()) > 0:
                try:
                    raw = await asyncio.wait_for(socket.recv(), timeout=left)
                except TimeoutError:
                    break
                now, message = time.time(), json.loads(raw)
                if message.get("type") == "snapshot" and message.get("ts"):
                    samples[0].append(now - message["ts"])
                    samples[1].append(now - message["published_at"])

    async def run() -> tuple[list[float], list[float]]:
        samples: tuple[list[float], list[float]] = ([], [])
        await asyncio.gather(*(client(samples) for _ in range(dashboards)))
        return samples

    return asyncio.run(run())


def row(clients: str, dashboards: int, end_to_end: list[float], delivery: list[float]) -> str:
    e2e = np.array(end_to_end) * 1000
    hop = np.array(delivery) * 1000
    cells = [f"{clients:>9}", f"{dashboards:>10}", f"{len(e2e):>8}"]
    cells += [f"{percentile(e2e, q):>8.1f}" for q in (50, 95, 99)] + [f"{e2e.max():>8.1f}"]
    cells += [f"{percentile(hop, q):>9.1f}" for q in (50, 95)]
    return " ".join(cells)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dashboards", default="1,20", help="comma-separated page counts")
    parser.add_argument("--seconds", type=float, default=20.0, help="measurement per count")
    parser.add_argument(
        "--clients",
        default="browser,websocket",
        help="browser (chromium pages) and/or websocket (no rendering)",
    )
    options = parser.parse_args()
    counts = [int(c) for c in options.dashboards.split(",")]
    setup_django()
    from django.conf import settings

    original = settings.DATABASES["default"]["NAME"]
    database = Database()
    processes = ProcessSet(cwd=ROOT)
    logs = ROOT / "var" / "bench"
    logs.mkdir(parents=True, exist_ok=True)
    try:
        cluster, session = seed()
        env = {
            **os.environ,
            "SWITCHYARD_DATABASE_URL": database.url(),
            "PYTHONUNBUFFERED": "1",
            "SWITCHYARD_SERVE_STATIC": "1",
        }
        port = free_port()
        web = processes.start(cp.web_command(port), logs / "uvicorn.log", env=env)
        processes.start(cp.publisher_command(), logs / "publisher.log", env=env)
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/healthz", 30, process=web, log=logs / "uvicorn.log")
        print_header(options, counts)
        from playwright.sync_api import sync_playwright

        kinds = options.clients.split(",")
        with Routers(cluster.name):
            if "websocket" in kinds:
                for count in counts:
                    print(
                        row(
                            "websocket",
                            count,
                            *measure_sockets(base, cluster.pk, session, count, options.seconds),
                        ),
                        flush=True,
                    )
            if "browser" in kinds:
                with sync_playwright() as playwright:
                    browser = playwright.chromium.launch(
                        executable_path=CHROMIUM, args=CHROMIUM_ARGS
                    )
                    for count in counts:
                        print(
                            row(
                                "browser",
                                count,
                                *measure(
                                    browser, base, cluster.pk, session, count, options.seconds
                                ),
                            ),
                            flush=True,
                        )
                    browser.close()
    finally:
        processes.stop_all()
        database.close(original)
    return 0


def print_header(options: argparse.Namespace, counts: list[int]) -> None:
    print(
        f"machine: {cpu_model()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    print(
        f"setup: {ROUTERS} fake routers x {INSTANCES} instances writing every 250 ms; "
        "publisher tick 250 ms, poll 25 ms; uvicorn (1 worker); chromium headless; "
        f"{options.seconds:g} s per row; dashboards {counts}"
    )
    print(
        "latency = browser receive time - router ts (end to end) and - publisher send time "
        "(delivery); ms"
    )
    print(
        f"{'clients':>9} {'dashboards':>10} {'samples':>8} {'p50':>8} {'p95':>8} "
        f"{'p99':>8} {'max':>8} {'deliv p50':>9} {'deliv p95':>9}"
    )


if __name__ == "__main__":
    sys.exit(main())
