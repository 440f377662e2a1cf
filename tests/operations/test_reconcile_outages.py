"""Reconcile restarts a router for heartbeat silence only while the control plane could
hear it: not while the web tier is down, not right after an outage, not after a gap in
reconcile's own runs. The control plane is a real server (pytest-django's live_server,
/healthz on the test database and Redis)."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta

import pytest

from controlplane.tasks.routing import reconcile_all
from devharness import free_port, wait_until
from tests.broker import queue_key
from tests.operations.helpers import router

pytestmark = pytest.mark.django_db(transaction=True)
TIMEOUT_S = 1.0


@pytest.fixture
def short_timeout(settings):
    settings.ROUTER_HEARTBEAT_TIMEOUT_S = TIMEOUT_S
    return settings


def actions(cluster) -> list[str]:
    return reconcile_all()[cluster.name]


def test_web_tier_down_restarts_nobody(routed_cluster, redis_client, settings):
    settings.SWITCHYARD_CONTROL_PLANE_URL = f"http://127.0.0.1:{free_port()}"
    router(routed_cluster, "r-silent", 8101, heartbeat_age_s=120, applied=1)
    assert actions(routed_cluster) == []
    assert actions(routed_cluster) == []


def test_after_an_outage_routers_get_a_whole_timeout_to_report(
    routed_cluster, redis_client, short_timeout, live_server
):
    short_timeout.SWITCHYARD_CONTROL_PLANE_URL = live_server.url
    router(routed_cluster, "r-quiet", 8102, heartbeat_age_s=120, applied=1)
    assert actions(routed_cluster) == []  # the control plane just started listening
    time.sleep(TIMEOUT_S * 1.5)
    assert actions(routed_cluster) == ["restart r-quiet"]


def test_a_gap_between_reconcile_runs_starts_the_window_again(
    routed_cluster, redis_client, short_timeout, live_server
):
    short_timeout.SWITCHYARD_CONTROL_PLANE_URL = live_server.url
    short_timeout.ROUTER_LISTEN_GAP_S = TIMEOUT_S
    router(routed_cluster, "r-gap", 8103, heartbeat_age_s=120, applied=1)
    assert actions(routed_cluster) == []
    time.sleep(TIMEOUT_S * 2)  # no run for longer than the gap: beat or Postgres was down
    assert actions(routed_cluster) == []
    taken = wait_until(  # runs close together: the window grows
        lambda: actions(routed_cluster), 20, "reconcile to act", interval=TIMEOUT_S / 5
    )
    assert taken == ["restart r-gap"]


def test_restart_requests_expire(
    routed_cluster,
    redis_client,
    short_timeout,
    live_server,
):
    """A request queued while the host's worker is away must not replay when it returns."""
    short_timeout.SWITCHYARD_CONTROL_PLANE_URL = live_server.url
    redis_client.delete(queue_key("routers.host-a"))
    router(routed_cluster, "r-away", 8104, heartbeat_age_s=120, applied=1)
    actions(routed_cluster)
    time.sleep(TIMEOUT_S * 1.5)
    earliest = datetime.now(UTC)  # the request is sent after this
    assert actions(routed_cluster) == ["restart r-away"]
    latest = datetime.now(UTC)  # and before this
    queued = [json.loads(m) for m in redis_client.lrange(queue_key("routers.host-a"), 0, -1)]
    redis_client.delete(queue_key("routers.host-a"))
    assert [m["headers"]["task"] for m in queued] == ["switchyard.restart_router"]
    # The README: "Restart requests expire after one heartbeat timeout" (from when sent).
    expires = datetime.fromisoformat(queued[0]["headers"]["expires"])
    timeout = timedelta(seconds=TIMEOUT_S)
    assert earliest + timeout <= expires <= latest + timeout, (earliest, expires, latest)
