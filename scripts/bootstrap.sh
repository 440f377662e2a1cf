#!/usr/bin/env bash
# Idempotent set-up shared by `make demo` and `make test`: virtualenv, Python and npm
# packages, (for tests) Debian's chromium and promtool, running Postgres/Redis, migrated database.
# Re-installs only when pyproject.toml, requirements.lock or the npm lockfile changed.
set -euo pipefail
cd "$(dirname "$0")/.."

WANT_BROWSER=${WANT_BROWSER:-0}
PYTHON=${PYTHON:-python3.11}

if ! command -v "$PYTHON" >/dev/null; then
  echo "Python 3.11 is required: install it (e.g. apt-get install python3.11 python3.11-venv) or set PYTHON=/path/to/python3.11." >&2
  exit 1
fi

stamp_of() { cat "$@" | sha256sum | cut -c1-16; }

if [ ! -x .venv/bin/python ]; then
  echo "Creating the virtualenv in .venv ..."
  "$PYTHON" -m venv .venv
fi
py_stamp=".venv/.installed-$(stamp_of pyproject.toml requirements.lock)"
if [ ! -f "$py_stamp" ]; then
  echo "Installing Python packages (hashed lock requirements.lock) ..."
  # Nothing unhashed is downloaded: the venv's own pip installs every third-party package
  # against its hash, wheels only (an sdist would fetch its build tools unchecked), the build
  # backend (setuptools) included; then the project itself, editable, built with that
  # setuptools and from no index (the lock already holds all of its extras).
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --require-hashes \
    --only-binary :all: -r requirements.lock
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-index --no-deps \
    --no-build-isolation -e .
  rm -f .venv/.installed-*
  touch "$py_stamp"
fi

if [ -f frontend/package-lock.json ]; then
  if ! command -v npm >/dev/null; then
    echo "npm is required for the dashboard's JavaScript packages: apt-get install npm." >&2
    exit 1
  fi
  js_stamp="frontend/node_modules/.installed-$(stamp_of frontend/package-lock.json)"
  if [ ! -f "$js_stamp" ]; then
    echo "Installing JavaScript packages (npm ci) ..."
    (cd frontend && npm ci --no-audit --no-fund --loglevel=error)
    touch "$js_stamp"
  fi
fi

apt_install() {
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
  else
    sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
  fi
}

if [ "$WANT_BROWSER" = 1 ] && [ ! -x /usr/bin/chromium ]; then
  echo "Installing Debian's chromium for the browser tests ..."
  apt_install chromium
fi
# promtool checks and unit-tests the generated alert rules (tests/operations/test_observability.py);
# the package's Prometheus server is installed beside it but not used
if [ "$WANT_BROWSER" = 1 ] && ! command -v promtool >/dev/null; then
  echo "Installing Debian's prometheus (promtool) for the alert rules' tests ..."
  apt_install --no-install-recommends prometheus
fi

bash scripts/ensure_services.sh
# The control plane refuses to start without a secret key; the demo's lives in var/ (as
# scripts/demo.py reads it) and is generated once.
if [ -z "${SWITCHYARD_SECRET_KEY:-}" ]; then
  if [ ! -s var/secret_key ]; then
    mkdir -p var
    (umask 077 && .venv/bin/python -c 'import secrets; print(secrets.token_urlsafe(50))' > var/secret_key)
  fi
  SWITCHYARD_SECRET_KEY="$(cat var/secret_key)"
  export SWITCHYARD_SECRET_KEY
fi
.venv/bin/python manage.py migrate --noinput -v 0
