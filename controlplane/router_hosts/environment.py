"""The environment a router process starts with: an explicit allowlist.

The routers worker runs with the control plane's secrets (Django's secret key, the database
URL and password, broker credentials). A router needs none of them: it reaches the control
plane over HTTP with its own token and Redis for telemetry. Anything not named here stays in
the worker, so a compromised or crash-dumped router cannot leak it.
"""

from __future__ import annotations

import os

from router_worker.contract.telemetry import (
    PEER_KEY_ENV,
    PEER_KEY_PREVIOUS_ENV,
    REDIS_URL_ENV,
    ROUTER_TOKEN_ENV,
)

# Process basics (finding Python and our code, locale, time zone, scratch space) and the
# router's own settings (see router_worker/cli.py for what it reads); and every OTEL_*.
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


def router_environment(
    token: str, redis_url: str, peer_keys: tuple[str, tuple[str, ...]] | None = None
) -> dict[str, str]:
    """The whole environment of a router spawned with `token`, reporting to `redis_url`
    (with its own credentials when it has a Redis identity), signing replica sync with
    the first of `peer_keys` and accepting the others."""
    env = {name: os.environ[name] for name in PASSED_THROUGH if name in os.environ}
    # OpenTelemetry's own variables: the router traces as the worker's environment says
    # (README, "Tracing"); OTLP headers may carry the collector's credentials, meant for it
    env.update({name: value for name, value in os.environ.items() if name.startswith("OTEL_")})
    env.update(
        {
            ROUTER_TOKEN_ENV: token,
            REDIS_URL_ENV: redis_url,
            "PYTHONUNBUFFERED": "1",
        }
    )
    if peer_keys is not None:
        current, previous = peer_keys
        env[PEER_KEY_ENV] = current
        if previous:
            env[PEER_KEY_PREVIOUS_ENV] = ",".join(previous)
    return env
