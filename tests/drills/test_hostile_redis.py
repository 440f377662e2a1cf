"""Drill: hostile documents in every Redis key and stream the control plane reads (a private
redis-server).

For each place (a router's state key, the sampled-decisions stream, the shared and the
cluster's own events and metrics streams, the config channel) the drill writes one valid
record, then hostile variants of it: nested 50 000 levels deep, NaN, Infinity, 1e999, a
10 MB value, not an object, not JSON, not UTF-8, a field of the wrong type (fields picked
by a seeded generator), a required field missing, and one with unknown fields (which is
valid and must be used). It also forges quarantine entries and counts, and puts a hash
where a state key belongs. The publisher runs all its loops meanwhile; ingest runs as beat
runs it; every page reading Redis is opened.

Goals: no 5xx; no publisher loop dies or even errs; every hostile record is either used
(the unknown-fields one) or counted in the quarantine, exactly once; every valid record is
still used (published, stored or folded), and a valid record sent after all the hostile
ones too.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from django.test import Client

from controlplane.models import IngestedRecord, RouterDeployment, RouterEvent
from controlplane.realtime.publisher import Publisher, PublisherSettings
from controlplane.services import clusters, ingest
from devharness import wait_until
from router_worker.contract.telemetry import (
    CONFIG_CHANNEL,
    EVENTS_STREAM,
    METRICS_STREAM,
    decisions_stream,
    events_stream,
    metrics_stream,
    state_key,
    state_pattern,
)
from tests.controlplane.helpers import SYSTEM, make_user
from tests.drills.report import Outcome, record

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]
CLUSTER = "hostile"
ROUTER = "r1"
SEED = 7
WRONG_FIELDS = 3  # wrong-typed variants per place
DEEP = "[" * 50_000 + "]" * 50_000


def valid_state(n: str) -> dict[str, Any]:
    window = {"seconds": 30, "requests": 3, "errors": 0, "requests_per_s": 0.1}
    return {
        "ts": time.time(),
        "cluster": CLUSTER,
        "router": n,
        "config_version": 1,
        "policy": "lmetric",
        "instances": [
            {
                "name": "i0",
                "health": "healthy",
                "pending_prefill_tokens": 5,
                "pending_prefill_tokens_max": 9,
                "batch_size": 1,
                "batch_size_max": 2,
                "in_flight": 1,
            }
        ],
        "window": {**window, "output_tokens_per_s": 10.0},
    }


def valid_decision(n: str) -> dict[str, Any]:
    return {
        "cluster": CLUSTER,
        "router": ROUTER,
        "request_id": n,
        "at": time.time(),
        "arm": "baseline",
        "policy": "lmetric",
        "instance": "i0",
        "reason": "score",
        "candidates": [{"instance": "i0", "score": 1.5}],
    }


def valid_event(n: str) -> dict[str, Any]:
    return {
        "id": n,
        "cluster": CLUSTER,
        "router": ROUTER,
        "kind": "health",
        "at": time.time(),
        "payload": {"instance": "i0", "before": "healthy", "after": "draining"},
    }


def valid_metrics(n: str) -> dict[str, Any]:
    return {
        "id": n,
        "cluster": CLUSTER,
        "router": ROUTER,
        "start": time.time() - 1,
        "end": time.time(),
        "arms": {"baseline": {"policy": "lmetric", "requests": 2, "ttft_s": [0.1, 0.2]}},
    }


def valid_config(n: str) -> dict[str, Any]:
    return {"cluster": CLUSTER, "version": int(n.rsplit("-", 1)[1])}


# place -> (valid document, the field naming a record, a numeric field)
PLACES = {
    "state": (valid_state, "router", "ts"),
    "decisions": (valid_decision, "request_id", "at"),
    "events": (valid_event, "id", "at"),
    "metrics": (valid_metrics, "id", "start"),
    "config": (valid_config, "version", "version"),
}


def _wrong(value: Any) -> Any:
    """A value no lax coercion turns into ``value``'s type."""
    if isinstance(value, str):
        return {"not": ["a string"]}
    if isinstance(value, int | float):
        return "not a number"
    if isinstance(value, list):
        return "not a list"
    return [1, 2]


def hostile(place: str, rng: random.Random, serial: list[int]) -> list[tuple[str, str, bytes]]:
    """(kind, name, raw) of each hostile variant; ``name`` identifies the record when used."""
    build, _, number = PLACES[place]

    def fresh() -> tuple[str, dict[str, Any]]:
        serial[0] += 1
        name = f"{place}-{serial[0]}"
        return name, build(name)

    def dump(document: Any) -> bytes:
        return json.dumps(document, allow_nan=True).encode()

    out = []
    for kind, edit in (
        ("deep nesting", lambda d: dump(d)[:-1] + b', "deep": ' + DEEP.encode() + b"}"),
        ("NaN", lambda d: dump({**d, number: float("nan")})),
        ("Infinity", lambda d: dump({**d, number: float("inf")})),
        ("1e999", lambda d: dump({**d, number: 0.5}).replace(b"0.5", b"1e999")),
        ("10 MB", lambda d: dump({**d, "padding": "x" * 10_000_000})),
        ("not an object", lambda d: dump([d])),
        ("not JSON", lambda d: dump(d)[:-1]),
        ("not UTF-8", lambda d: b"\xff\xfe" + dump(d)),
        ("missing field", lambda d: dump({k: v for k, v in d.items() if k != number})),
        ("unknown fields", lambda d: dump({**d, "future": {"nested": [1, {"x": None}]}})),
    ):
        name, document = fresh()
        out.append((kind, name, edit(document)))
    for _ in range(WRONG_FIELDS):
        name, document = fresh()
        field = rng.choice(sorted(document))
        out.append(
            (f"wrong type: {field}", name, dump({**document, field: _wrong(document[field])}))
        )
    return out


class Collector:
    def __init__(self) -> None:
        self.messages: list[dict] = []

    async def __call__(self, group: str, message: dict) -> None:
        json.dumps(message, allow_nan=False)  # what a browser's JSON.parse accepts
        self.messages.append(message)

    def used(self, place: str) -> set[str]:
        names: set[str] = set()
        for m in list(self.messages):
            if place == "state" and m["type"] == "snapshot":
                names |= {r["router"] for r in m["routers"]}
            elif place == "decisions" and m["type"] == "decisions":
                names |= {d["request_id"] for d in m["decisions"]}
            elif place == "config" and m["type"] == "config":
                names.add(f"config-{m['version']}")
        return names


class PublisherThread:
    """The publisher with all its loops, in a thread of its own, as `run_publisher` runs it."""

    def __init__(self, url: str, cluster_id: int) -> None:
        self.sent = Collector()
        self.stop: asyncio.Event | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.publisher: Publisher | None = None
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._main, args=(url, cluster_id), daemon=True)
        self.thread.start()
        wait_until(lambda: self.publisher is not None, 10, "the publisher started")

    @property
    def running(self) -> Publisher:
        assert self.publisher is not None  # __init__ waited for it
        return self.publisher

    def _main(self, url: str, cluster_id: int) -> None:
        async def main() -> None:
            self.loop, self.stop = asyncio.get_running_loop(), asyncio.Event()
            client = aioredis.from_url(url)
            settings = PublisherSettings(interval_s=0.1, poll_s=0.02, scan_s=0.2)
            publisher = Publisher(
                client, self.sent, settings, load_clusters=lambda: {CLUSTER: cluster_id}
            )
            self.publisher = publisher
            try:
                await publisher.run(self.stop)
            finally:
                await client.aclose()

        try:
            asyncio.run(main())
        except BaseException as error:  # a dead loop: reported by the test
            self.failure = error

    def close(self) -> None:
        if self.loop is not None and self.stop is not None:
            self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(timeout=10)


def write(client: redis.Redis, place: str, name: str, raw: bytes, turn: int) -> None:
    if place == "state":
        client.set(state_key(CLUSTER, name), raw, ex=120)
    elif place == "decisions":
        client.xadd(decisions_stream(CLUSTER), {"data": raw})
    elif place == "events":
        stream = (EVENTS_STREAM, events_stream(CLUSTER))[turn % 2]
        client.xadd(stream, {"data": raw})
    elif place == "metrics":
        stream = (METRICS_STREAM, metrics_stream(CLUSTER))[turn % 2]
        client.xadd(stream, {"data": raw})
    else:
        client.publish(CONFIG_CHANNEL, raw)


def counted(client: redis.Redis, place: str) -> int:
    sources = {
        "state": [state_pattern(CLUSTER)],
        "decisions": [decisions_stream(CLUSTER)],
        "events": [EVENTS_STREAM, events_stream(CLUSTER)],
        "metrics": [METRICS_STREAM, metrics_stream(CLUSTER)],
        "config": [CONFIG_CHANNEL],
    }[place]
    return sum(int(client.hget(ingest.QUARANTINE_COUNTS, s) or 0) for s in sources)


def stored(place: str, collector: Collector) -> set[str]:
    if place == "events":
        return set(RouterEvent.objects.values_list("event_id", flat=True))
    if place == "metrics":
        return set(IngestedRecord.objects.values_list("record_id", flat=True))
    return collector.used(place)


def ingest_round(client: redis.Redis) -> None:
    while ingest.ingest_events(client).read + ingest.ingest_metrics(client).read:
        pass


PAGES = (
    "/",
    "/clusters/{id}/",
    "/clusters/{id}/snapshot.json",
    "/clusters/{id}/routers/",
    "/clusters/{id}/policy/",
    "/clusters/{id}/replays/",
    "/hotspots/",
    "/audit/",
    "/telemetry/quarantine/",
    "/api/v1/telemetry-quarantine?limit=1000",
)


def test_hostile_documents_in_every_key_and_stream(drill_redis, settings):
    settings.REDIS_URL = drill_redis.url  # pages read the private Redis
    cluster = clusters.create_cluster(SYSTEM, name=CLUSTER, model="qwen2-7b", gpu_type="h20")
    RouterDeployment.objects.create(cluster=cluster, name=ROUTER, host="127.0.0.1", port=1)
    viewer = Client()
    viewer.force_login(make_user("viewer"))
    client = redis.Redis.from_url(drill_redis.url)
    publisher = PublisherThread(drill_redis.url, cluster.pk)
    try:
        wait_until(lambda: client.pubsub_numsub(CONFIG_CHANNEL)[0][1] == 1, 10, "subscribed")
        wait_until(
            lambda: publisher.running.feeds[CLUSTER].decisions_cursor is not None,
            10,
            "the publisher's decision cursor",
        )
        rng, serial = random.Random(SEED), [0]
        sent: dict[str, list[tuple[str, str, bytes]]] = {}
        good: dict[str, list[str]] = {}
        for turn, place in enumerate(PLACES):
            name = f"{place}-good-{turn}" if place != "config" else "config-1000"
            write(client, place, name, json.dumps(PLACES[place][0](name)).encode(), 0)
            sent[place] = hostile(place, rng, serial)
            for index, (_, hostile_name, raw) in enumerate(sent[place]):
                write(client, place, hostile_name, raw, index)
            good[place] = [name]
        client.hset(state_key(CLUSTER, "as-a-hash"), "not", "a string")
        client.expire(state_key(CLUSTER, "as-a-hash"), 120)
        client.hset(ingest.QUARANTINE_COUNTS, mapping={"forged": "lots", "forged-2": -3})
        client.xadd(ingest.QUARANTINE_STREAM, {"at": "inf", "data_bytes": "many", "x": DEEP})
        ingest_round(client)
        # after every hostile record, one more valid record in each place: still used
        for place in PLACES:
            name = f"{place}-after" if place != "config" else "config-1001"
            write(client, place, name, json.dumps(PLACES[place][0](name)).encode(), 1)
            good[place].append(name)
        statuses: dict[str, int] = {}

        def caught_up() -> bool:
            ingest_round(client)
            for path in PAGES:
                url = path.format(id=cluster.pk)
                statuses[url] = viewer.get(url).status_code
            return all(
                set(good[p]) <= stored(p, publisher.sent)
                and counted(client, p) >= len(sent[p]) - 1 + (p == "state")
                for p in PLACES
            )

        started = time.monotonic()
        wait_until(caught_up, 30, "every valid record used and every hostile one counted")
        recovery_s = time.monotonic() - started
        alive = publisher.thread.is_alive() and publisher.failure is None
        loop_errors = publisher.running.loop_errors
        snapshot = json.loads(
            viewer.get(f"/clusters/{cluster.pk}/snapshot.json").content,
            parse_constant=lambda name: pytest.fail(f"{name} in snapshot.json"),
        )
    finally:
        publisher.close()
    outcome, per_place = Outcome(), {}
    for place, variants in sent.items():
        used = stored(place, publisher.sent)
        for name in good[place]:
            outcome.add("ok" if name in used else "lost", f"{place}: valid {name} not used")
        quarantined = counted(client, place) - (place == "state")  # the hash at a state key
        accepted = [kind for kind, name, _ in variants if name in used]
        per_place[place] = (len(variants), quarantined, accepted)
        for kind, name, _ in variants:
            outcome.add("ok" if name in used else "clear", f"{place}: {kind}")
        if quarantined + len(accepted) != len(variants):
            outcome.add("lost", f"{place}: {len(variants)} sent, {quarantined} counted, {accepted}")
    page_errors = {url: s for url, s in statuses.items() if s >= 500}
    events_lost = len([n for n in good["events"] if n not in stored("events", publisher.sent)])
    outcome.audit_events_lost = events_lost
    client.close()
    record(
        "hostile documents in every Redis key and stream (fuzz)",
        outcome,
        recovery_s,
        notes=f"{sum(len(v) for v in sent.values())} hostile records in 5 places "
        "(deep nesting, NaN, Infinity, 1e999, 10 MB, not an object, not JSON, not UTF-8, "
        f"missing and wrong-typed fields, unknown fields) plus forged quarantine entries: "
        + "; ".join(f"{p} {n} sent, {q} quarantined" for p, (n, q, _) in per_place.items())
        + f"; {len(PAGES)} pages, 5xx: {len(page_errors)}; publisher loops alive: {alive}, "
        f"errors survived: {loop_errors}; recovery = all written -> all used or counted",
    )
    assert alive and loop_errors == 0, publisher.failure
    assert not page_errors, page_errors
    assert outcome.lost == 0, outcome.lost_examples
    assert all(accepted == ["unknown fields"] for _, _, accepted in per_place.values()), per_place
    unknown = next(n for kind, n, _ in sent["state"] if kind == "unknown fields")
    routers = {r["router"] for r in snapshot["live"]["routers"]}
    assert routers == {"state-good-0", "state-after", unknown}, routers
