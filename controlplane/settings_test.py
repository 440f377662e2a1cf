"""Settings for the test suite: the same as production settings, on Redis database 9 (10 and up
for parallel workers) so tests never read or flush the keys of a running `make demo`."""

import os
import uuid

# Parallel test workers (pytest-xdist's gw0, gw1, ...) get one Redis database each (10, 11,
# ...), as pytest-django gives each its own test database: Celery queues, channel groups and
# routers' state never cross between workers.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
_REDIS_DB = 10 + int(_WORKER.removeprefix("gw")) if _WORKER.startswith("gw") else 9
_LOCAL_REDIS = "redis://127.0.0.1:6379/"
# A worker inherits its controller's environment, where this module has already set the
# controller's database (9): that inherited default is replaced, a URL someone chose is kept.
if os.environ.get("SWITCHYARD_REDIS_URL", _LOCAL_REDIS + "9") == _LOCAL_REDIS + "9":
    os.environ["SWITCHYARD_REDIS_URL"] = f"{_LOCAL_REDIS}{_REDIS_DB}"
os.environ.setdefault("SWITCHYARD_CHANNEL_PREFIX", "switchyard-test:asgi")
# One test run: its Celery messages carry its id in their keys, so a task an earlier run left
# queued never reaches this run's workers (it would name rows of this run's freshly numbered
# tables). Parallel workers share their run's id; processes the tests start inherit it.
os.environ.setdefault(
    "SWITCHYARD_TEST_RUN", os.environ.get("PYTEST_XDIST_TESTRUNUID") or uuid.uuid4().hex
)
# A fixed key for tests only (production settings refuse to start without one).
os.environ.setdefault("SWITCHYARD_SECRET_KEY", "switchyard-test-only-secret-key-never-deploy")
# The machine's Redis is shared: supervised routers in tests get no ACL users there (the
# drills, on their own redis-server, run with them).
os.environ.setdefault("SWITCHYARD_ROUTER_REDIS_ACL", "off")

from .settings import *  # noqa: E402, F403  (after the environment defaults above)

# Close connections at the end of each request/task so worker threads started by tests do
# not hold the test database open at teardown.
DATABASES["default"]["CONN_MAX_AGE"] = 0  # noqa: F405
# Concurrent test runs on one machine (several developers) each need their own database.
DATABASES["default"]["TEST"]["NAME"] = os.environ.get(  # noqa: F405
    "SWITCHYARD_TEST_DB",
    DATABASES["default"]["TEST"]["NAME"],  # noqa: F405
)
CELERY_BROKER_TRANSPORT_OPTIONS = {
    **CELERY_BROKER_TRANSPORT_OPTIONS,  # noqa: F405
    "global_keyprefix": f"switchyard-test-{os.environ['SWITCHYARD_TEST_RUN']}:",
}
