"""Django settings for Switchyard's control plane.

Every setting that differs between machines comes from an environment variable with a
working local default (Postgres and Redis on 127.0.0.1), so a fresh checkout runs as is.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


def env(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    return env(name, "1" if default else "0").lower() in {"1", "true", "yes", "on"}


def database_from_url(url: str) -> dict:
    """Django's DATABASES entry for a ``postgres://user:password@host:port/name`` URL.

    Parsed by dj-database-url, which percent-decodes each part (a password holding ``@`` or
    ``/`` is written ``%40``/``%2F``); unset parts fall back to the local defaults.
    """
    if urlparse(url).scheme not in {"postgres", "postgresql"}:
        raise ValueError(
            f"SWITCHYARD_DATABASE_URL must be a postgres:// URL, got {redacted(url)!r}"
        )
    try:
        config = dj_database_url.parse(url, conn_max_age=60, conn_health_checks=True)
    except ValueError:
        # from None: the parser's own error may quote a piece of the password
        raise ValueError(
            "SWITCHYARD_DATABASE_URL is not a valid URL (percent-encode each part), "
            f"got {redacted(url)!r}"
        ) from None
    name = config.get("NAME") or "switchyard"
    return {
        **config,
        "NAME": name,
        "USER": config.get("USER") or "postgres",
        "PASSWORD": config.get("PASSWORD") or "",
        "HOST": config.get("HOST") or "127.0.0.1",
        "PORT": str(config.get("PORT") or 5432),
        "OPTIONS": {**config.get("OPTIONS", {}), "connect_timeout": 3},
        "TEST": {"NAME": f"test_{name}"},
    }


def redacted(url: str) -> str:
    """``url`` for an error message, its password shown as ``***``: everything between the
    user name and the last ``@``, however malformed the URL (a password may hold ``@``,
    ``/`` or ``://`` unencoded)."""
    credentials, at, location = url.rpartition("@")
    if not at:
        return url
    scheme, separator, userinfo = credentials.partition("://")
    if not separator:
        scheme, userinfo = "", credentials
    user, colon, _password = userinfo.partition(":")
    return f"{scheme}{separator}{user}{':***' if colon else ''}@{location}"


def required_secret_key() -> str:
    """The key signing sessions and CSRF tokens. There is no fallback: a default would be
    public (it is in this repository), and anyone could forge a session with it. `make demo`
    generates one into var/secret_key; the tests set theirs in settings_test."""
    key = os.environ.get("SWITCHYARD_SECRET_KEY", "").strip()
    if not key:
        raise ImproperlyConfigured(
            "SWITCHYARD_SECRET_KEY is not set. Generate one with "
            "`python -c 'import secrets; print(secrets.token_urlsafe(50))'` and set it in the "
            "environment of every control-plane process (web, Celery workers and beat)."
        )
    return key


DEBUG = env_bool("SWITCHYARD_DEBUG", False)
SECRET_KEY = required_secret_key()
# Rotating the key: the old one here (comma-separated) until every router has restarted;
# sessions signed with it stay valid, and routers keep accepting peer batches signed with
# the key derived from it (controlplane/router_hosts/identity.py). A canary keeps the salt
# it was published with (controlplane/services/config.py), so no session changes arm.
SECRET_KEY_FALLBACKS = [
    key.strip() for key in env("SWITCHYARD_SECRET_KEY_FALLBACKS", "").split(",") if key.strip()
]
ALLOWED_HOSTS = [h for h in env("SWITCHYARD_ALLOWED_HOSTS", "127.0.0.1,localhost").split(",") if h]
CSRF_TRUSTED_ORIGINS = [
    o
    for o in env("SWITCHYARD_CSRF_TRUSTED_ORIGINS", "http://127.0.0.1,http://localhost").split(",")
    if o
]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "ninja",  # serves the API docs' Swagger UI from its own static files, not a CDN
    "controlplane",
]

MIDDLEWARE = [
    "controlplane.tracing.TracingMiddleware",  # removes itself unless OTEL_* ask for traces
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
]

# Browser hardening. No inline script anywhere (our JS is in static files, data reaches it
# through data- attributes and json_script), so the CSP forbids it: a stored string that
# slips past escaping still cannot run. Inline style attributes stay allowed (a few
# templates and uPlot use them; they cannot run code). Websockets are same-origin.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'", "'unsafe-inline'"],
        "img-src": ["'self'", "data:"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    },
}
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
# Served over TLS (directly or behind a proxy that sets X-Forwarded-Proto): cookies only
# over HTTPS, and browsers told to keep to HTTPS for a year.
TLS = env_bool("SWITCHYARD_TLS", False)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = TLS
SECURE_HSTS_SECONDS = 31_536_000 if TLS else 0
SECURE_HSTS_INCLUDE_SUBDOMAINS = TLS
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if TLS else None

ROOT_URLCONF = "controlplane.urls"
ASGI_APPLICATION = "controlplane.asgi.application"
MIGRATION_MODULES = {"controlplane": "migrations"}

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "frontend" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": database_from_url(
        env("SWITCHYARD_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/switchyard")
    )
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env("SWITCHYARD_REDIS_URL", "redis://127.0.0.1:6379/0")
# Seconds a health probe or a request-path Redis call may wait before calling Redis down.
REDIS_SOCKET_TIMEOUT = float(env("SWITCHYARD_REDIS_TIMEOUT", "1.0"))

# channels-redis waits for a websocket's messages with a blocking pop of up to 5 s, and
# redis-py 8 reads every reply with a 5 s socket timeout by default: a pop answered a little
# late on a busy host raised TimeoutError and killed the consumer, closing its websocket
# without a close frame. The layer's reads get three pops' worth.
CHANNEL_LAYER_SOCKET_TIMEOUT = 15.0
CHANNEL_LAYERS: dict[str, dict[str, Any]] = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            "hosts": [{"address": REDIS_URL, "socket_timeout": CHANNEL_LAYER_SOCKET_TIMEOUT}],
            "prefix": env("SWITCHYARD_CHANNEL_PREFIX", "switchyard:asgi"),
            "capacity": 500,
            "expiry": 30,
        },
    }
}

# Celery: see controlplane/celery.py for the reliability reasoning.
CELERY_BROKER_URL = env("SWITCHYARD_CELERY_BROKER_URL", REDIS_URL)
CELERY_RESULT_BACKEND = env("SWITCHYARD_CELERY_RESULT_BACKEND", REDIS_URL)
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {"visibility_timeout": 3600}

# Where routers started by a host's supervisor reach the control plane's API.
SWITCHYARD_CONTROL_PLANE_URL = env("SWITCHYARD_CONTROL_PLANE_URL", "http://127.0.0.1:8080")
SWITCHYARD_VAR_DIR = env("SWITCHYARD_VAR_DIR", str(BASE_DIR / "var"))
# Seconds without a heartbeat after which reconcile restarts a router that should run.
ROUTER_HEARTBEAT_TIMEOUT_S = float(env("SWITCHYARD_ROUTER_HEARTBEAT_TIMEOUT", "15"))
# Reconcile runs every 5 s; a longer gap between runs (beat, workers or Postgres down) means
# the control plane may not have been listening, and heartbeat silence starts counting anew.
ROUTER_LISTEN_GAP_S = float(env("SWITCHYARD_ROUTER_LISTEN_GAP", "12"))
# Seconds after which an open websocket re-checks its session and role before its next push
# (changes that announce themselves close it at once; see controlplane/realtime/access.py).
WEBSOCKET_RECHECK_S = float(env("SWITCHYARD_WEBSOCKET_RECHECK", "30"))
# Managed routers get a Redis user of their own (made by the routers worker with ACL
# SETUSER), allowed only their cluster's keys and channels: see router_hosts/identity.py.
# "off" for a Redis without ACLs (before 7.0) or that the control plane may not administer:
# routers then connect with the control plane's URL. Users are named <prefix>router-<id>.
ROUTER_REDIS_ACL = env("SWITCHYARD_ROUTER_REDIS_ACL", "on").lower() != "off"
ROUTER_REDIS_ACL_PREFIX = env("SWITCHYARD_ROUTER_REDIS_ACL_PREFIX", "switchyard-")


# The niceness supervised routers run at ("" leaves them at the worker's): e.g. -10 where
# they share a host with other work (router_worker/README.md, "Sizing"); a value the
# worker may not set is logged by the router, which then runs at the worker's.
def router_niceness() -> int | None:
    value = env("SWITCHYARD_ROUTER_NICE", "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise ImproperlyConfigured(
            f"SWITCHYARD_ROUTER_NICE must be an integer niceness (e.g. -10), not {value!r}."
        ) from None


ROUTER_NICE = router_niceness()

# This deployment's canary defaults (the form's and the API's): a JSON object with any
# guardrail (e.g. {"min_samples": 30}) and "weight_steps" (e.g. [25, 50]); validated at
# start-up with the guardrails' model (controlplane/services/guardrails.py), so a bad value
# stops the process naming the variable and the field.
SWITCHYARD_CANARY_DEFAULTS = env("SWITCHYARD_CANARY_DEFAULTS", "")

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS: list[str | Path | tuple[str, str | Path]] = [BASE_DIR / "frontend" / "static"]
# Third-party JS (uPlot, htmx) is installed by npm into frontend/node_modules and served from
# there under /static/vendor/ — never copied into the repository.
NODE_MODULES_DIR = BASE_DIR / "frontend" / "node_modules"
if NODE_MODULES_DIR.is_dir():
    STATICFILES_DIRS.append(("vendor", NODE_MODULES_DIR))

LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

# Request bodies, refused by controlplane/body_limit.py before Django reads them: 1 MiB for
# any request (kept under FILE_UPLOAD_MAX_MEMORY_SIZE, 2.5 MB, so a refused body never
# reaches the disk); a replay trace upload of up to 64 MiB for a signed-in operator.
SWITCHYARD_MAX_BODY_BYTES = int(env("SWITCHYARD_MAX_BODY_BYTES", str(1024 * 1024)))
SWITCHYARD_MAX_TRACE_UPLOAD_BYTES = int(
    env("SWITCHYARD_MAX_TRACE_UPLOAD_BYTES", str(64 * 1024 * 1024))
)


def retention_days(name: str, default: str) -> float:
    """A retention period in days, from 0.05 (72 minutes) to 100 years (``inf`` broke
    every run of its task, ``-1`` deleted everything at once); else the process stops,
    naming the variable."""
    value = env(name, default).strip()
    try:
        days = float(value)
    except ValueError:
        days = math.nan
    if not (value.replace(".", "", 1).isdigit() and 0.05 <= days <= 36_500):
        raise ImproperlyConfigured(
            f"{name} must be a number of days from 0.05 to 36500 (e.g. 30), not {value!r}."
        )
    return days


# Uploaded traces no job has used for this long are deleted by the `prune-uploads` task.
SWITCHYARD_UPLOAD_RETENTION_DAYS = retention_days("SWITCHYARD_UPLOAD_RETENTION_DAYS", "7")
# Stopped traffic captures (controlplane/services/captures.py) are deleted this long after.
SWITCHYARD_CAPTURE_RETENTION_DAYS = retention_days("SWITCHYARD_CAPTURE_RETENTION_DAYS", "30")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env("SWITCHYARD_LOG_LEVEL", "INFO")},
}
