"""Hostile records where routers write their live state, and hostile query values: the
pages stay up (no 5xx), the bad record is skipped, the good ones are still shown, and what
reaches the browser is JSON that ``JSON.parse`` accepts (no NaN or Infinity)."""

from __future__ import annotations

import json
import time

import pytest
import redis
from django.urls import reverse

from controlplane.models import AuditEvent
from router_worker.contract.telemetry import decisions_stream, state_key

from .helpers import clear_state, instance, snapshot, write_state

pytestmark = pytest.mark.django_db(transaction=True)
DEEP = "[" * 100_000 + "]" * 100_000


def strict_json(text: str):
    """Parse as a browser does: NaN and Infinity are not JSON."""

    def refuse(name: str):
        raise AssertionError(f"{name} in a response")

    return json.loads(text, parse_constant=refuse)


def decision(cluster: str, request_id: str, **overrides) -> str:
    base = {
        "cluster": cluster,
        "router": "r1",
        "request_id": request_id,
        "at": time.time(),
        "arm": "baseline",
        "policy": "lmetric",
        "instance": "i0",
        "reason": "score",
    }
    return json.dumps({**base, **overrides}, allow_nan=True)


LIFETIME_S = 600


@pytest.fixture
def hostile(cluster, redis_client: redis.Redis):
    name = cluster.name
    good = snapshot(name, "good", [instance("i0", pending=7)])
    write_state(redis_client, good)
    # Kept for the whole test (it clears them): a router's 10 s TTL ran out while a loaded
    # machine served the pages below, and the good record was gone before it was read.
    redis_client.expire(state_key(name, "good"), LIFETIME_S)
    document = json.loads(good.model_dump_json())
    nan = {**document, "router": "nan", "window": {**document["window"], "ttft_p50_s": "NaN"}}
    for router, value in {
        "deep": '{"ts": 1, "instances": ' + DEEP + "}",
        "nan": json.dumps(nan).replace('"NaN"', "NaN"),
        "inf": json.dumps({**document, "router": "inf", "ts": 1e400}).replace("1e400", "1e999"),
        "huge": json.dumps({**document, "router": "huge", "pad": "x" * 10_000_000}),
        "list": "[1, 2]",
    }.items():
        redis_client.set(state_key(name, router), value, ex=LIFETIME_S)
    redis_client.hset(state_key(name, "hash"), "a", "b")  # not even a string
    redis_client.expire(state_key(name, "hash"), LIFETIME_S)
    stream = decisions_stream(name)
    redis_client.xadd(stream, {"data": decision(name, "ok-1")})
    redis_client.xadd(stream, {"data": decision(name, "nan", ttft_s=float("nan"))})
    redis_client.xadd(stream, {"data": '{"cluster": ' + DEEP + "}"})
    redis_client.xadd(stream, {"data": decision(name, "ok-2", unknown_field={"x": 1})})
    yield cluster
    clear_state(redis_client, name)
    redis_client.delete(stream)


def test_hostile_live_state_leaves_every_page_up_and_the_good_records_shown(hostile, as_role):
    viewer = as_role("operator")
    at = f"/clusters/{hostile.pk}"
    for url in ("/", f"{at}/", f"{at}/routers/", f"{at}/replays/", f"{at}/policy/"):
        response = viewer.get(url)
        assert response.status_code == 200, (url, response.status_code)
    response = viewer.get(f"{at}/snapshot.json")
    assert response.status_code == 200
    paint = strict_json(response.content.decode())
    assert [r["router"] for r in paint["live"]["routers"]] == ["good"]
    assert paint["live"]["instances"][0]["pending_prefill_tokens"] == 7
    assert [d["request_id"] for d in paint["decisions"]] == ["ok-2", "ok-1"]


UNREADABLE = (
    "{at}/?at=inf",
    "{at}/snapshot.json?at=inf",
    "{at}/snapshot.json?at=nan",
    "{at}/snapshot.json?at=1e300",
    "{at}/snapshot.json?at=9999-12-31T23:59",
    "{at}/snapshot.json?at=2020-13-01T00:00",
    "/hotspots/?cluster=²",
    "/audit/?cluster=99999999999999999999",
    "/hotspots/?since=2020-13-01",
    "/audit/?until=2020-02-30T10:00",
    "/audit/?actor=a%00b",
    "/hotspots/?prefix_class=%00",
)


def test_unreadable_query_values_are_refused_with_400(cluster, as_role):
    viewer = as_role("viewer")
    at = f"/clusters/{cluster.pk}"
    statuses = {url: viewer.get(url.format(at=at)).status_code for url in UNREADABLE}
    assert statuses == dict.fromkeys(UNREADABLE, 400)


def test_readable_query_values_still_work(cluster, as_role):
    viewer = as_role("viewer")
    at = f"/clusters/{cluster.pk}"
    for url in (
        f"{at}/snapshot.json?at={time.time():.0f}",
        f"{at}/snapshot.json?at=2024-05-01T10:00",
        f"/hotspots/?cluster={cluster.pk}&since=2024-05-01T10:00",
        "/audit/?cluster=&since=",
    ):
        assert viewer.get(url).status_code == 200, url


def test_a_long_request_id_is_cut_and_a_nul_in_a_form_refused(cluster, as_role):
    operator = as_role("admin")
    url = reverse("web:client_key_create", args=[cluster.pk])
    form = {"name": "k1", "reason": "for the drill"}
    response = operator.post(url, form, headers={"X-Request-ID": "r" * 200})
    assert response.status_code < 400
    assert AuditEvent.objects.filter(action__startswith="client_key").get().request_id == "r" * 64
    refused = operator.post(url, {"name": "k2", "reason": "nul\x00here"})
    assert refused.status_code == 400
    assert AuditEvent.objects.filter(action__startswith="client_key").count() == 1
