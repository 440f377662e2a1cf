"""Run the Switchyard stack in the foreground; Ctrl-C stops every process it started.

Started by `make demo` after scripts/bootstrap.sh. Each process runs in its own process
group with its output in var/log/<name>.log, so stopping the demo leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VAR = ROOT / "var"
BIN = ROOT / ".venv" / "bin"
HOST = os.environ.get("SWITCHYARD_HOST", "127.0.0.1")
PORT = int(os.environ.get("SWITCHYARD_PORT", "8080"))
STOP_GRACE_S = 10.0


@dataclass
class Service:
    name: str
    argv: list[str]
    process: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def log_path(self) -> Path:
        return VAR / "log" / f"{self.name}.log"

    def start(self, env: dict[str, str]) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            self.argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )

    def exited(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def signal_group(self, signum: int) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signum)

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


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
    env["PYTHONUNBUFFERED"] = "1"
    return env


def services() -> list[Service]:
    celery = [str(BIN / "celery"), "-A", "controlplane"]
    return [
        Service("web", [str(BIN / "uvicorn"), "controlplane.asgi:application",
                        "--host", HOST, "--port", str(PORT), "--no-access-log"]),
        Service("worker", [*celery, "worker", "-Q", "default", "-c", "1",
                           "-n", "general@%h", "--loglevel", "INFO"]),
        Service("beat", [*celery, "beat", "--loglevel", "INFO",
                         "-s", str(VAR / "celerybeat-schedule")]),
    ]


def reset_credentials(env: dict[str, str]) -> tuple[str, str]:
    out = subprocess.run(
        [str(BIN / "python"), "manage.py", "demo_credentials"],
        cwd=ROOT, env=env, check=True, capture_output=True, text=True,
    )
    username, password = out.stdout.split()[-2:]
    return username, password


def wait_healthy(url: str, running: list[Service], timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(s.exited() is not None for s in running):
            return False
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    return False


def stop_all(running: list[Service]) -> None:
    for service in running:
        service.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for service in running:
        while service.exited() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        service.signal_group(signal.SIGKILL)
        if service.process is not None:
            service.process.wait()


def supervise(running: list[Service]) -> int:
    while True:
        for service in running:
            code = service.exited()
            if code is not None:
                print(f"\n{service.name} exited with code {code}; stopping the demo. "
                      f"Last lines of {service.log_path}:\n{service.tail()}", file=sys.stderr)
                return 1
        time.sleep(0.5)


def main() -> int:
    env = stack_env()
    username, password = reset_credentials(env)
    running = services()
    interrupted = False

    def on_signal(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)  # also when started with SIGINT ignored (nohup, &)
    try:
        for service in running:
            service.start(env)
        base = f"http://{HOST}:{PORT}"
        if not wait_healthy(f"{base}/healthz", running):
            failed = [s for s in running if s.exited() is not None] or running[:1]
            print(f"The stack did not become healthy; see {failed[0].log_path}:\n"
                  f"{failed[0].tail()}", file=sys.stderr)
            return 1
        print(f"\nSwitchyard is up: {base}/admin/\n  login: {username} / {password}\n"
              f"  health: {base}/healthz\n  logs: {VAR / 'log'}\nPress Ctrl-C to stop.\n",
              flush=True)
        return supervise(running)
    except KeyboardInterrupt:
        interrupted = True
        return 0
    finally:
        if interrupted:
            print("\nStopping ...", flush=True)
        stop_all(running)
        print("Stopped every process the demo started.", flush=True)


if __name__ == "__main__":
    sys.exit(main())
