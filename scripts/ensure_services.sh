#!/usr/bin/env bash
# Make sure Postgres and Redis answer on 127.0.0.1; start them when installed but stopped.
# Ends with one clear sentence when a service cannot be had.
set -euo pipefail

PGHOST=127.0.0.1 PGPORT=${SWITCHYARD_PG_PORT:-5432}
REDIS_PORT=${SWITCHYARD_REDIS_PORT:-6379}

wait_for() {  # wait_for <seconds> <command...>
  local seconds=$1; shift
  for _ in $(seq $((seconds * 5))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  return 1
}

postgres_up() { pg_isready -q -h "$PGHOST" -p "$PGPORT"; }
redis_up() { redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping | grep -q PONG; }

if ! command -v pg_isready >/dev/null; then
  echo "PostgreSQL client tools are missing: install Debian's postgresql package (apt-get install postgresql) and run this again." >&2
  exit 1
fi
if ! postgres_up; then
  echo "Postgres is not answering on $PGHOST:$PGPORT; starting it..."
  if command -v pg_ctlcluster >/dev/null && ls /etc/postgresql >/dev/null 2>&1; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | sort -V | tail -n1)" main start || true
  fi
  if ! wait_for 20 postgres_up; then
    echo "Postgres could not be started: install Debian's postgresql package or point SWITCHYARD_DATABASE_URL at a running server." >&2
    exit 1
  fi
fi

if ! command -v redis-cli >/dev/null; then
  echo "Redis is missing: install Debian's redis-server package (apt-get install redis-server) and run this again." >&2
  exit 1
fi
if ! redis_up; then
  echo "Redis is not answering on 127.0.0.1:$REDIS_PORT; starting it..."
  mkdir -p /var/lib/redis /var/log/redis 2>/dev/null || true
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port "$REDIS_PORT" --save "" \
    --appendonly no --dir /var/lib/redis --logfile /var/log/redis/switchyard.log || true
  if ! wait_for 10 redis_up; then
    echo "Redis could not be started: install Debian's redis-server package or point SWITCHYARD_REDIS_URL at a running server." >&2
    exit 1
  fi
fi

# The application database (the test database is created by pytest-django).
DB_NAME=${SWITCHYARD_DB_NAME:-switchyard}
if ! psql -h "$PGHOST" -p "$PGPORT" -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname='$DB_NAME'" | grep -q 1; then
  createdb -h "$PGHOST" -p "$PGPORT" -U postgres "$DB_NAME"
  echo "Created database $DB_NAME."
fi
