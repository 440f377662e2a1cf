"""Drill: the capture and replay paths under hostile input, and forms that must not turn a
typo into live routing. Each row counts the inputs tried, the 5xx answers seen, the
entries lost (a typo that went live, a capture entry neither stored nor quarantined, a
forged record folded) and the loops stalled (an ingest run that stored nothing while
entries waited, a replay job left running): the goal is 0, 0, 0.

Fed in process (Django's test client, ingest and the replay task called as the workers
call them) with scaled-down limits where a real one would take minutes."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import redis
from django.conf import settings
from django.test import Client
from django.urls import reverse

from controlplane.models import (
    ArmMetricRollup,
    CapturedRequest,
    ConfigVersion,
    Policy,
    ReplayJob,
    RouterDeployment,
)
from controlplane.services import captures, ingest
from controlplane.services.audit import Actor
from controlplane.tasks.replay import run_replay
from router_worker.contract.telemetry import (
    ArmMetrics,
    CaptureBatch,
    CaptureRecord,
    MetricsRecord,
    capture_stream,
    encode_block_hashes,
    router_metrics_stream,
)
from tests.drills.report import Outcome, record
from tests.web.helpers import make_cluster, make_user

pytestmark = pytest.mark.django_db
TYPOS = ["2e", "1.2.3", "1,5", "1_0", "0x10", "inf", "nan", "1e999", "٣", "9" * 5000, "- 1"]


@pytest.fixture
def operator() -> Client:
    client = Client()
    client.force_login(make_user("operator", f"drill-op-{uuid.uuid4().hex[:6]}"))
    return client


@pytest.fixture
def client_redis() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.REDIS_URL)
    yield client
    client.close()


def _row(name: str, outcome: Outcome, fivexx: int, lost: int, stalled: int, notes: str) -> None:
    record(
        name,
        outcome,
        None,
        notes=notes,
        inputs_tried=outcome.sent,
        fivexx_seen=fivexx,
        entries_lost=lost,
        loops_stalled=stalled,
    )


def test_typos_in_every_number_field_never_go_live(operator, traces) -> None:
    cluster = make_cluster(name=f"drill-forms-{uuid.uuid4().hex[:6]}")
    versions = ConfigVersion.objects.filter(cluster=cluster).count()
    outcome, fivexx, live = Outcome(), 0, 0
    forms: list[tuple[str, dict[str, str], str]] = []
    for typo in TYPOS:
        forms += [
            (
                reverse("web:policy_apply", args=[cluster.pk]),
                {"policy": "new", "name": f"p{len(forms)}", "kind": "lmetric", "confirm": "yes"}
                | {"reason": "drill", "param.decode_slack": typo, "param.hotspot.enabled": "on"},
                "decode_slack",
            ),
            (
                reverse("web:replay_create", args=[cluster.pk]),
                {"trace": "mooncake_synthetic_trace.jsonl", "max_requests": typo}
                | {"policies": str(cluster.active_policy_id)},
                "max_requests",
            ),
            (
                reverse("web:capture_start", args=[cluster.pk]),
                {"name": f"c{len(forms)}", "max_minutes": typo},
                "max_minutes",
            ),
            (reverse("web:token_create"), {"name": "t", "valid_days": typo}, "valid_days"),
        ]
    for url, data, field in forms:
        response = operator.post(url, data)
        fivexx += response.status_code >= 500
        named = response.status_code == 400 and field in response.content.decode()
        outcome.add("clear" if named else "lost", f"{url} {field}={data.get(field)!r}")
    live = (
        ConfigVersion.objects.filter(cluster=cluster).count()
        - versions
        + Policy.objects.filter(cluster=cluster, name__startswith="p").count()
        + ReplayJob.objects.filter(cluster=cluster).count()
        + cluster.captures.count()
    )
    _row(
        "typos in every form's numbers",
        outcome,
        fivexx,
        live,
        0,
        f"{len(TYPOS)} typos x policy, replay, capture and token forms; each refused with "
        "a 400 naming its field; nothing stored, activated or queued",
    )
    assert (outcome.failed_clear, fivexx, live) == (outcome.sent, 0, 0), outcome.lost_examples


def _capture_wire(at: float, blocks: int, seed: int) -> CaptureRecord:
    ids = np.random.default_rng(seed).integers(1, 2**62, blocks).tolist()
    return CaptureRecord(
        at=at,
        prompt_tokens=blocks * 16,
        output_tokens=4,
        block_size=16,
        block_hashes=encode_block_hashes(ids),
        status=200,
    )


def test_hostile_capture_entries_never_wedge_ingest(client_redis, monkeypatch) -> None:
    cluster = make_cluster(name=f"drill-cap-{uuid.uuid4().hex[:6]}")
    RouterDeployment.objects.create(cluster=cluster, name="r0", host="drill", port=1)
    stream = capture_stream(cluster.name)
    client_redis.delete(stream)
    capture = captures.start_capture(Actor(name="drill"), cluster.pk, name="hostile")
    now = time.time()
    outcome = Outcome()

    def send(requests: list[CaptureRecord], router: str = "r0") -> None:
        batch = CaptureBatch(
            id=uuid.uuid4().hex,
            cluster=cluster.name,
            router=router,
            capture=capture.pk,
            requests=requests,
        )
        client_redis.xadd(stream, batch.to_stream_fields())
        outcome.sent += 1

    for index in range(40):  # large prompts: slow to store, the wedge of old
        send([_capture_wire(now + index, 8192, index)])
    send([_capture_wire(now, 10, 1), _capture_wire(now, captures.MAX_BLOCKS + 100, 2)])
    send([_capture_wire(now, 10, 3).model_copy(update={"prompt_tokens": -1})])
    send([_capture_wire(now, 10, 4)], router="stranger")
    client_redis.xadd(stream, {"data": "{not json"})
    outcome.sent += 1
    size = len(client_redis.xrange(stream, count=1)[0][1][b"data"])
    monkeypatch.setattr(ingest, "CAPTURE_SLICE_BYTES", 2 * size)
    monkeypatch.setattr(ingest, "CAPTURE_RUN_BYTES", 8 * size)
    runs = stalled = 0
    handled = 0
    while client_redis.xlen(stream) and runs < 50:
        result = ingest.ingest_captures(client_redis)
        runs += 1
        stalled += result.read == 0
        handled += result.stored + result.duplicates + result.quarantined
    lost = outcome.sent - handled + client_redis.xlen(stream)
    outcome.succeeded = handled - 2  # the stranger's and the unreadable entry: quarantined
    outcome.failed_clear = 2
    client_redis.delete(stream)
    stored = CapturedRequest.objects.filter(capture=capture).count()
    _row(
        "hostile capture entries at ingest",
        outcome,
        0,
        lost,
        stalled,
        f"{outcome.sent} entries (40 of 8,192 blocks, one prompt over {captures.MAX_BLOCKS} "
        f"blocks, a negative count, a stranger's, not JSON) in {runs} runs of a scaled-down "
        f"budget ({8 * size} bytes); {stored} requests stored, 2 entries quarantined",
    )
    assert (lost, stalled) == (0, 0)
    assert stored == 42  # the oversize prompt kept (its first blocks), the bad one dropped


def test_hostile_replays_always_end(cluster_with_traces) -> None:
    cluster, folder = cluster_with_traces
    shapes: dict[str, tuple[list[float], dict[str, Any]]] = {
        "a day between arrivals": ([0, 86_400, 86_401], {}),
        "a year between arrivals": ([0, 3.2e7, 3.2e7 + 1], {}),
        "a tiny rate scale": ([0, 5, 9], {"rate_scales": [1e-9]}),
        "one session of 3,000 turns": ([i * 0.01 for i in range(3000)], {"session": True}),
    }
    outcome, stalled = Outcome(), 0
    for name, (times, options) in shapes.items():
        path = folder / f"{uuid.uuid4().hex[:8]}.jsonl"
        session = options.pop("session", False)
        path.write_text(
            "".join(
                json.dumps(
                    {
                        "chat_id": i + 1,
                        "parent_chat_id": i if session and i else -1,
                        "timestamp": t,
                        "input_length": 64,
                        "output_length": 4,
                        "hash_ids": [i],
                        "type": "text",
                        "turn": 1,
                    }
                )
                + "\n"
                for i, t in enumerate(times)
            )
        )
        job = ReplayJob.objects.create(
            cluster=cluster,
            inputs={
                "trace": f"shared:{path.name}",
                "policies": [{"kind": "round_robin", "params": {}}],
                "max_requests": 500,
                **options,
            },
        )
        state = run_replay(job.pk)
        job.refresh_from_db()
        stalled += job.state not in ("succeeded", "failed")
        outcome.add(
            "ok" if state == "succeeded" else "clear" if job.error else "lost",
            f"{name}: {state} {job.error[:100]}",
        )
    _row(
        "hostile traces replayed",
        outcome,
        0,
        outcome.lost,
        stalled,
        "each job ended: idle stretches skipped, a span past 8 simulated days refused "
        "with its reason, one long session loaded in linear time",
    )
    assert (outcome.lost, stalled) == (0, 0), outcome.lost_examples


def test_forged_metrics_are_never_folded(client_redis) -> None:
    cluster = make_cluster(name=f"drill-met-{uuid.uuid4().hex[:6]}")
    for port, name in enumerate(("r0", "r1"), 1):
        RouterDeployment.objects.create(cluster=cluster, name=name, host="drill", port=port)
    sibling = router_metrics_stream(cluster.name, "r1")
    outcome = Outcome()
    for index in range(20):  # r1 writing in its own stream, half of it as r0
        record_ = MetricsRecord(
            id=uuid.uuid4().hex,
            cluster=cluster.name,
            router="r0" if index % 2 else "r1",
            start=1_800_000_000.0 + index,
            end=1_800_000_001.0 + index,
            arms={"candidate": ArmMetrics(policy="lmetric", requests=1000, ttft_s=[0.001])},
        )
        client_redis.xadd(sibling, record_.to_stream_fields())
        outcome.sent += 1
    result = ingest.ingest_metrics(client_redis)
    client_redis.delete(sibling)
    folded = sum(r.requests for r in ArmMetricRollup.objects.filter(cluster=cluster))
    forged_folded = max(0, folded - 10 * 1000)
    outcome.succeeded, outcome.failed_clear = result.stored, result.quarantined
    _row(
        "forged metrics under a sibling's name",
        outcome,
        0,
        forged_folded // 1000,
        0,
        f"{result.quarantined} of 20 records quarantined (a router naming another in its "
        f"own stream); {folded} requests folded, all the sender's own",
    )
    assert (result.stored, result.quarantined, forged_folded) == (10, 10, 0)


@pytest.fixture
def cluster_with_traces(tmp_path, monkeypatch):
    folder = tmp_path / "traces"
    folder.mkdir()
    monkeypatch.setenv("SWITCHYARD_TRACES_DIR", str(folder))
    return make_cluster(name=f"drill-rep-{uuid.uuid4().hex[:6]}"), folder


@pytest.fixture
def traces(tmp_path, monkeypatch, settings):
    from tests.web.helpers import TRACE

    folder = tmp_path / "traces"
    folder.mkdir()
    source = settings.BASE_DIR.parent / "shared" / "traces" / TRACE
    lines = source.read_text().splitlines()[:80]
    (folder / TRACE).write_text("\n".join(lines) + "\n")
    monkeypatch.setenv("SWITCHYARD_TRACES_DIR", str(folder))
    settings.SWITCHYARD_VAR_DIR = str(tmp_path / "var")
    return folder
