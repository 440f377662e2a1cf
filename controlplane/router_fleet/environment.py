"""The environment a router process starts with: an explicit allowlist.

The routers worker runs with the control plane's secrets (Django's secret key, the database
URL and password, broker credentials). A router needs none of them: it reaches the control
plane over HTTP with its own token and Redis for telemetry. Anything not named here stays in
the worker, so a compromised or crash-dumped router cannot leak it.
"""

from __future__ import annotations

import os

# Process basics (finding Python and our code, locale, time zone, scratch space) and the
# router's own settings (see router_worker/cli.py for what it reads).
PASSED_THROUGH = (
    "PATH",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "HOME",
    "LANG",
    "LC_ALL",
    "TZ",
    "TMPDIR",
    "SWITCHYARD_LOG_LEVEL",
    "SWITCHYARD_ROUTER_ADMIN_TOKEN",
)


def router_environment(token: str, redis_url: str) -> dict[str, str]:
    """The whole environment of a router spawned with `token`, reporting to `redis_url`."""
    env = {name: os.environ[name] for name in PASSED_THROUGH if name in os.environ}
    env.update(
        {
            "SWITCHYARD_ROUTER_TOKEN": token,
            "SWITCHYARD_REDIS_URL": redis_url,
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env
