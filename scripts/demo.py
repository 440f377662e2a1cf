"""Run the whole Switchyard stack on a simulated 16 x H20 cluster; Ctrl-C stops it all.

Started by `make demo` after scripts/bootstrap.sh. It seeds the demo cluster, then starts,
each in its own process group with output in var/log/<name>.log:

  engines   16 enginesim H20 instances serving Qwen2-7B (ports 9100-9115, KV events 5600+)
  engines-pd  the disaggregated cluster's 4 (2 prefill, 2 decode; ports 9200-9203, KV
            events 5800+), with their own router (port 8001), served only what is sent to it
  web       the control plane (uvicorn, ASGI: Django + Channels)
  publisher the dashboard's telemetry publisher
  worker    a general Celery worker (ingest, rollups, scraping, canary judge)
  replays   a Celery worker for what-if replays (minutes each, so on their own queue)
  routers   this host's Celery `routers` worker, which starts and supervises the router
  beat      Celery beat
  loadgen   a load generator replaying a real shared trace in a loop through the router

Each run starts fresh: the database, the Redis database and the routers' saved configs of
an earlier run are emptied first (`make demo KEEP=1`, `--keep` or SWITCHYARD_DEMO_KEEP=1
keeps them, with the first run's policies, canaries, captures and replays).

Knobs (environment): SWITCHYARD_DEMO_TIME_SCALE (wall seconds per simulated second; the
engines run in slow motion so two cores can carry sixteen of them), SWITCHYARD_DEMO_TRACE,
SWITCHYARD_DEMO_RATE (the trace's speed relative to the engines: 0.68 puts the default trace
at 55-60% busy), SWITCHYARD_DEMO_TIER_BLOCKS (blocks of a global KV tier shared by the
sixteen engines, default 0 = none; with one, the live view shows its traffic),
SWITCHYARD_DEMO_GPU_MEMORY (the engines' --gpu-memory-utilization, default 0.5: a KV cache
of about 590k tokens per instance, so the KV column moves; replays use the scraped size),
SWITCHYARD_HOST / SWITCHYARD_PORT (control plane), SWITCHYARD_ROUTER_PORT,
SWITCHYARD_DEMO_INSTANCES (16), SWITCHYARD_DEMO_ENGINE_PORT (9100: instance k on 9100+k,
the engines' admin API on 9099) and SWITCHYARD_DEMO_KV_PORT (5600: KV events); for the
disaggregated cluster SWITCHYARD_DEMO_PD_INSTANCES (4, half prefill and half decode; 0 = no
such cluster), SWITCHYARD_DEMO_PD_ENGINE_PORT (9200), SWITCHYARD_DEMO_PD_KV_PORT (5800) and
SWITCHYARD_DEMO_PD_ROUTER_PORT (the router port + 1).
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from devharness import Fleet, ManagedProcess, WaitTimeout, stop_together, wait_until
from devharness import control_plane as cp

ROOT = Path(__file__).resolve().parent.parent
VAR = Path(os.environ.get("SWITCHYARD_VAR_DIR", ROOT / "var"))  # as the control plane's
BIN = ROOT / ".venv" / "bin"
PYTHON = str(BIN / "python")
HOST = os.environ.get("SWITCHYARD_HOST", "127.0.0.1")
PORT = int(os.environ.get("SWITCHYARD_PORT", "8080"))
ROUTER_PORT = int(os.environ.get("SWITCHYARD_ROUTER_PORT", "8000"))
ROUTER_HOST_NAME = "localhost"  # the RouterDeployment host this machine's worker claims
INSTANCES = int(os.environ.get("SWITCHYARD_DEMO_INSTANCES", "16"))
ENGINE_BASE_PORT = int(os.environ.get("SWITCHYARD_DEMO_ENGINE_PORT", "9100"))
KV_EVENTS_BASE_PORT = int(os.environ.get("SWITCHYARD_DEMO_KV_PORT", "5600"))
ENGINE_ADMIN_PORT = ENGINE_BASE_PORT - 1
# The disaggregated cluster: its own engines (the first half prefill, the rest decode), KV
# events (their replay sockets 100 above, clear of the main fleet's) and router.
PD_INSTANCES = int(os.environ.get("SWITCHYARD_DEMO_PD_INSTANCES", "4"))
if PD_INSTANCES == 1 or PD_INSTANCES < 0:
    sys.exit("SWITCHYARD_DEMO_PD_INSTANCES must be 0 (none) or at least 2 (prefill and decode)")
PD_ENGINE_BASE_PORT = int(os.environ.get("SWITCHYARD_DEMO_PD_ENGINE_PORT", "9200"))
PD_KV_EVENTS_BASE_PORT = int(os.environ.get("SWITCHYARD_DEMO_PD_KV_PORT", "5800"))
PD_ROUTER_PORT = int(os.environ.get("SWITCHYARD_DEMO_PD_ROUTER_PORT", str(ROUTER_PORT + 1)))


def positive_env(name: str, default: str) -> float:
    """A positive number from the environment, or exit naming the variable."""
    raw = os.environ.get(name, default)
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        sys.exit(f"{name} must be a positive number, not {raw!r}")
    return value


TIME_SCALE = positive_env("SWITCHYARD_DEMO_TIME_SCALE", "2")
TRACE = Path(
    os.environ.get(
        "SWITCHYARD_DEMO_TRACE",
        ROOT.parent / "shared" / "traces" / "mooncake_conversation_t0-2700s.jsonl",
    )
)
# The evaluation matrix calibrates this trace on 16 x H20 at busy = 0.707 * rate^0.85 over
# the whole trace (bench/replay/README.md, "Calibration"): 0.68 gives about 51% busy there;
# the trace's first 15 minutes at the demo's KV size replay at 55-58% (README.md), where
# queues form and the policy decides how long they get, without the overload of the
# trace's own rate.
RATE = positive_env("SWITCHYARD_DEMO_RATE", "0.68")
MAX_MODEL_LEN = 131072
# A demo's canary schedule: one step of half the traffic, judged once it has run 30 s and
# holds 20 samples per arm (a verdict in a minute or two at the demo's one request a
# second), not the built-in 10/25/50% and 50 samples a production fleet's traffic fills. An
# inconclusive step still waits for more samples (up to max_wait_seconds, 600 s).
DEMO_CANARY_DEFAULTS = '{"weight_steps": [50], "min_samples": 20, "step_seconds": 30}'


def tier_blocks_env(name: str = "SWITCHYARD_DEMO_TIER_BLOCKS") -> int:
    """Blocks of the engines' global KV tier (0 = none), or exit naming the variable."""
    raw = os.environ.get(name, "0")
    if not raw.isdigit():
        sys.exit(f"{name} must be a whole number of blocks (0 = no tier), not {raw!r}")
    return int(raw)


TIER_BLOCKS = tier_blocks_env()
GPU_MEMORY = positive_env("SWITCHYARD_DEMO_GPU_MEMORY", "0.5")
STOP_GRACE_S = 10.0
READY_TIMEOUT_S = 90.0


def log_path(name: str) -> Path:
    return VAR / "log" / f"{name}.log"


@dataclass
class DemoProcess:
    """A process of the stack: ``argv``, or the enginesim ``fleet`` (started by the harness)."""

    name: str
    argv: list[str] = field(default_factory=list)
    fleet: Fleet | None = None
    managed: ManagedProcess | None = field(default=None, repr=False)

    @property
    def log_path(self) -> Path:
        return log_path(self.name)

    def start(self, env: dict[str, str]) -> None:
        if self.fleet is not None:
            self.managed = self.fleet.start(wait=False).managed
            return
        # its own process group: stopping it reaches Celery's pool and uvicorn's children
        self.managed = ManagedProcess(
            self.argv, env=env, log=self.log_path, cwd=ROOT, new_session=True
        ).start()

    def exited(self) -> int | None:
        return None if self.managed is None else self.managed.poll()

    def tail(self, lines: int = 15) -> str:
        text = "" if self.managed is None else self.managed.tail(chars=20_000)
        return "\n".join(text.splitlines()[-lines:])


def secret_key() -> str:
    path = VAR / "secret_key"
    if not path.exists():
        VAR.mkdir(exist_ok=True)
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


def stack_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("SWITCHYARD_SECRET_KEY", secret_key())
    env.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    env.setdefault("SWITCHYARD_CONTROL_PLANE_URL", f"http://{HOST}:{PORT}")
    env["SWITCHYARD_ROUTER_HOST"] = ROUTER_HOST_NAME
    env["PYTHONUNBUFFERED"] = "1"
    # The demo serves about one request a second: canaries with the form's defaults (the
    # seeded one and those started from a replay too) get their 20 samples per arm at 50%
    # and reach a verdict in a minute or two, not hours.
    env.setdefault("SWITCHYARD_CANARY_DEFAULTS", DEMO_CANARY_DEFAULTS)
    return env


def seed(env: dict[str, str], fresh: bool) -> dict[str, str]:
    """Seed the demo cluster (after emptying an earlier run's state when ``fresh``);
    returns {"cluster": id, "operator": pw, "admin": pw, "reset": "what, ..."}."""
    out = subprocess.run(
        [
            PYTHON,
            "manage.py",
            "seed_demo",
            *(["--fresh"] if fresh else []),
            "--instances",
            str(INSTANCES),
            "--engine-base-port",
            str(ENGINE_BASE_PORT),
            "--kv-events-base-port",
            str(KV_EVENTS_BASE_PORT),
            "--router-host",
            ROUTER_HOST_NAME,
            "--router-port",
            str(ROUTER_PORT),
            "--time-scale",
            str(TIME_SCALE),
            "--pd-instances",
            str(PD_INSTANCES),
            "--pd-engine-base-port",
            str(PD_ENGINE_BASE_PORT),
            "--pd-kv-events-base-port",
            str(PD_KV_EVENTS_BASE_PORT),
            "--pd-router-port",
            str(PD_ROUTER_PORT),
        ],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    values: dict[str, str] = {}
    reset: list[str] = []
    for line in out.stdout.splitlines():
        key, value = line.split(maxsplit=1)
        if key == "reset":
            reset.append(value)
        else:
            values[key] = value.split()[0]
    values["reset"] = ", ".join(reset)
    return values


def engine_fleet(env: dict[str, str]) -> Fleet:
    return Fleet(
        INSTANCES,
        time_scale=TIME_SCALE,
        kv_events=True,
        base_port=ENGINE_BASE_PORT,
        admin_port=ENGINE_ADMIN_PORT,
        kv_port=KV_EVENTS_BASE_PORT,
        # Qwen2-7B's 128k context (YaRN), as in the evaluation matrix: the trace's long
        # prompts are served, not refused
        # half the H20's memory for the model and its KV cache (vLLM's 0.9 leaves 1.3M
        # tokens per instance, which the demo's load never fills past a few percent)
        extra=[
            "--max-model-len",
            str(MAX_MODEL_LEN),
            "--global-tier-blocks",
            str(TIER_BLOCKS),
            "--gpu-memory-utilization",
            f"{GPU_MEMORY:g}",
        ],
        log=log_path("engines"),
        cwd=ROOT,
        env=env,
        new_session=True,
        grace=STOP_GRACE_S,
    )


def pd_fleet(env: dict[str, str]) -> Fleet | None:
    """The disaggregated cluster's engines (None: SWITCHYARD_DEMO_PD_INSTANCES=0). Idle but
    for what is sent to its router: the trace's load goes to the main cluster only."""
    if not PD_INSTANCES:
        return None
    prefill = PD_INSTANCES // 2
    return Fleet(
        PD_INSTANCES,
        time_scale=TIME_SCALE,
        kv_events=True,
        base_port=PD_ENGINE_BASE_PORT,
        admin_port=PD_ENGINE_BASE_PORT - 1,
        kv_port=PD_KV_EVENTS_BASE_PORT,
        extra=[
            "--roles",
            f"prefill@0-{prefill - 1},decode@{prefill}-{PD_INSTANCES - 1}",
            "--max-model-len",
            str(MAX_MODEL_LEN),
            "--gpu-memory-utilization",
            f"{GPU_MEMORY:g}",
        ],
        log=log_path("engines-pd"),
        cwd=ROOT,
        env=env,
        new_session=True,
        grace=STOP_GRACE_S,
    )


def stack_processes(engines: Fleet, pd: Fleet | None = None) -> list[DemoProcess]:
    return [
        DemoProcess("engines", fleet=engines),
        *([DemoProcess("engines-pd", fleet=pd)] if pd is not None else []),
        DemoProcess("web", cp.web_command(PORT, HOST, log_level="info")),
        DemoProcess("publisher", cp.publisher_command()),
        DemoProcess("worker", cp.worker_command("default", "general")),
        DemoProcess("replays", cp.worker_command("replays", "replays")),
        DemoProcess(
            "routers",
            cp.worker_command(
                cp.routers_queues(ROUTER_HOST_NAME), "routers", solo=True, supervise_routers=True
            ),
        ),
        DemoProcess("beat", cp.beat_command(VAR / "celerybeat-schedule")),
    ]


def loadgen_process() -> DemoProcess:
    # The engines run TIME_SCALE times slower than an H20, so the trace is replayed that
    # much slower too: the cluster sees RATE times the trace's real relative load.
    return DemoProcess(
        "loadgen",
        [
            PYTHON,
            "-m",
            "enginesim",
            "loadgen",
            "--trace",
            str(TRACE),
            "--target",
            f"http://127.0.0.1:{ROUTER_PORT}",
            "--rate-scale",
            f"{RATE / TIME_SCALE:g}",
            "--loop",
        ],
    )


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def wait_for(what: str, ready: Callable[[], bool], running: list[DemoProcess]) -> None:
    def check() -> bool:
        dead = [s for s in running if s.exited() is not None]
        if dead:
            raise StackFailed(dead[0])
        return ready()

    try:
        wait_until(check, READY_TIMEOUT_S, what, interval=0.5, ignore=())
    except WaitTimeout:
        raise StackFailed(None, f"{what} was not ready within {READY_TIMEOUT_S:.0f}s") from None


class StackFailed(Exception):
    def __init__(self, service: DemoProcess | None, message: str = "") -> None:
        super().__init__(message)
        self.service = service
        self.message = message

    def describe(self) -> str:
        if self.service is None:
            return f"{self.message}; see the logs in {VAR / 'log'}"
        return (
            f"{self.service.name} exited with code {self.service.exited()}; last lines "
            f"of {self.service.log_path}:\n{self.service.tail()}"
        )


def stop_all(running: list[DemoProcess]) -> None:
    stop_together([s.managed for s in running if s.managed is not None], STOP_GRACE_S)


def supervise(running: list[DemoProcess]) -> None:
    while True:
        for service in running:
            if service.exited() is not None:
                raise StackFailed(service)
        time.sleep(0.5)


def banner(logins: dict[str, str]) -> str:
    base = f"http://{HOST}:{PORT}"
    if logins.get("reset"):
        state = (
            f"  state:     fresh (emptied the earlier run's {logins['reset']} and the routers'"
            " saved configs; `make demo KEEP=1` keeps them)\n"
        )
    else:
        state = (
            "  state:     kept from the earlier run (KEEP=1); the demo's seed only adds what"
            " is missing (instances, policies, a draft canary, a running capture) and issues"
            " new passwords\n"
        )
    return (
        f"\nSwitchyard is up on a simulated {INSTANCES} x H20 cluster "
        f"(time scale {TIME_SCALE:g}: engines run {TIME_SCALE:g}x slower than real).\n"
        f"  dashboard: {base}/clusters/{logins['cluster']}/\n"
        f"  login:     operator / {logins['operator']}   (admin / {logins['admin']})\n"
        f"  router:    http://127.0.0.1:{ROUTER_PORT}/v1  (OpenAI-compatible)\n"
        f"{pd_banner(base, logins)}"
        f"  load:      replaying {TRACE.name} in a loop at {RATE:g}x its rate\n"
        f"{state}"
        f"  logs:      {VAR / 'log'}\nPress Ctrl-C to stop everything.\n"
    )


def pd_banner(base: str, logins: dict[str, str]) -> str:
    if "pd_cluster" not in logins:
        return ""
    prefill = PD_INSTANCES // 2
    return (
        f"  disaggregated: {base}/clusters/{logins['pd_cluster']}/ ({prefill} prefill + "
        f"{PD_INSTANCES - prefill} decode, no background load)\n"
        f"                 router http://127.0.0.1:{PD_ROUTER_PORT}/v1\n"
    )


def keep_requested(argv: list[str]) -> bool:
    """Whether to keep the earlier run's state: ``--keep`` or SWITCHYARD_DEMO_KEEP=1."""
    unknown = [arg for arg in argv if arg != "--keep"]
    if unknown:
        sys.exit(
            f"unknown argument {unknown[0]!r}; the only one is --keep (keep the earlier state)"
        )
    return "--keep" in argv or os.environ.get("SWITCHYARD_DEMO_KEEP", "") not in ("", "0")


def run(running: list[DemoProcess], fresh: bool) -> int:
    if not TRACE.is_file():
        print(
            f"The demo trace {TRACE} is missing: set SWITCHYARD_DEMO_TRACE to a trace file "
            "(see ../shared/traces/README.md).",
            file=sys.stderr,
        )
        return 1
    env = stack_env()
    logins = seed(env, fresh)
    engines, pd = engine_fleet(env), pd_fleet(env)
    running.extend(stack_processes(engines, pd))
    for service in running:
        service.start(env)
    wait_for("the engines", engines.healthy, running)
    if pd is not None:
        wait_for("the disaggregated cluster's engines", pd.healthy, running)
    wait_for("the control plane", lambda: http_ok(f"http://{HOST}:{PORT}/healthz"), running)
    wait_for("the router", lambda: http_ok(f"http://127.0.0.1:{ROUTER_PORT}/health"), running)
    if pd is not None:
        pd_health = f"http://127.0.0.1:{PD_ROUTER_PORT}/health"
        wait_for("the disaggregated cluster's router", lambda: http_ok(pd_health), running)
    loadgen = loadgen_process()
    loadgen.start(env)
    running.append(loadgen)
    print(banner(logins), flush=True)
    supervise(running)
    return 0


def main() -> int:
    fresh = not keep_requested(sys.argv[1:])
    running: list[DemoProcess] = []

    def on_signal(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)  # also when started with SIGINT ignored (nohup, &)
    try:
        return run(running, fresh)
    except StackFailed as failure:
        print(f"\nThe demo stopped: {failure.describe()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nStopping ...", flush=True)
        return 0
    finally:
        stop_all(running)
        print("Stopped every process the demo started.", flush=True)


if __name__ == "__main__":
    sys.exit(main())
