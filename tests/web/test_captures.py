"""Traffic capture from the browser's forms: start, watch, stop, rename, download, delete,
and replay a capture; every bad value is refused with a clear 4xx."""

from __future__ import annotations

import json
import random
import time

import pytest
from asgiref.sync import async_to_sync
from django.urls import reverse

from controlplane.models import AuditEvent, CapturedRequest, ReplayJob, TrafficCapture
from controlplane.services import config, policies
from controlplane.tasks.replay import run_replay
from tests.web.helpers import SYSTEM, make_cluster

pytestmark = pytest.mark.django_db


def start(client, cluster, **fields):
    form = {"name": "peak", "max_requests": "500", "max_minutes": "30", "reason": "r"} | fields
    return client.post(reverse("web:capture_start", args=[cluster.pk]), form)


def act(client, cluster, capture, action, **form):
    url = reverse("web:capture_action", args=[cluster.pk, capture.pk, action])
    return client.post(url, form)


def fill(
    capture: TrafficCapture,
    count: int,
    first: int = 0,
    *,
    version: int | None = None,
    arm: str = "",
    ttft: float = 0.2,
) -> None:
    """Rows as ingest stores them: two sessions sharing a 20-block prefix, 1 s apart,
    routed under config ``version`` in ``arm`` (None, "": a router that did not say)."""
    rng = random.Random(1)
    prefix = [rng.randrange(2**62) for _ in range(20)]
    t0 = time.time()
    CapturedRequest.objects.bulk_create(
        CapturedRequest(
            capture=capture,
            batch=f"b{first + k}",
            router="r0",
            at=t0 + first + k,
            prompt_tokens=16 * 22,
            output_tokens=30,
            block_size=16,
            hash_ids=prefix + [rng.randrange(2**62) for _ in range(2)],
            session=f"s{k % 2}",
            instance="i0",
            arm=arm,
            config_version=version,
            status=200,
            ttft_s=ttft,
            tpot_s=0.02,
        )
        for k in range(count)
    )
    TrafficCapture.objects.filter(pk=capture.pk).update(requests=first + count)


def test_an_operator_starts_and_stops_a_capture_and_everyone_sees_it(as_role, cluster):
    operator, viewer = as_role("operator"), as_role("viewer")
    assert start(viewer, cluster).status_code == 403
    assert start(operator, cluster).status_code == 302
    capture = TrafficCapture.objects.get()
    assert (capture.name, capture.max_requests, capture.max_duration_s) == ("peak", 500, 1800)
    version = config.latest_version(cluster)
    assert version is not None and version.document["capture"]["id"] == capture.pk
    page = viewer.get(reverse("web:captures", args=[cluster.pk])).content.decode()
    assert 'data-testid="capture-running"' in page and "peak" in page
    assert capture.salt not in page
    live = viewer.get(reverse("web:cluster", args=[cluster.pk])).content.decode()
    assert 'data-testid="capture-banner"' in live
    assert start(operator, cluster, name="second").status_code == 409
    assert act(operator, cluster, capture, "stop", reason="enough").status_code == 302
    capture.refresh_from_db()
    assert capture.state == "stopped"
    live = viewer.get(reverse("web:cluster", args=[cluster.pk])).content.decode()
    assert 'data-testid="capture-banner"' not in live
    api = operator.get(f"/api/v1/clusters/{cluster.pk}/config-versions")
    assert api.status_code == 200
    documents = [v["document"] for v in api.json()]
    assert {"id": capture.pk, "salt": "(hidden)"} in [d.get("capture") for d in documents]
    assert capture.salt not in api.content.decode()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"name": ""}, "name must be 1-64 printable characters"),
        ({"name": "x" * 65}, "name must be 1-64 printable characters"),
        ({"name": "tab\there"}, "name must be 1-64 printable characters"),
        ({"max_requests": "-1"}, "max_requests must be a whole number from 1 to 2000000"),
        ({"max_requests": "1e99"}, "max_requests must be a whole number from 1 to 2000000"),
        ({"max_requests": "9999999"}, "max_requests must be a whole number from 1 to 2000000"),
        ({"max_minutes": "0"}, "max_minutes must be a whole number from 1 to 10080"),
        ({"max_minutes": "half"}, "max_minutes must be a whole number from 1 to 10080"),
        ({"engine_time_scale": "fast"}, "engine_time_scale must be a number from 0.001 to 1000"),
        ({"engine_time_scale": "0"}, "engine_time_scale must be a number from 0.001 to 1000"),
        ({"engine_time_scale": "nan"}, "engine_time_scale must be a number from 0.001 to 1000"),
        ({"engine_time_scale": "1e999"}, "engine_time_scale must be a number from 0.001 to 1000"),
    ],
)
def test_bad_capture_settings_get_a_clear_400(as_role, cluster, fields, message):
    response = start(as_role("operator"), cluster, **fields)
    assert response.status_code == 400
    assert message in response.content.decode()
    assert not TrafficCapture.objects.exists()


def test_a_nul_in_a_capture_form_is_refused(as_role, cluster):
    assert start(as_role("operator"), cluster, name="a\x00b").status_code == 400


def streamed(response) -> bytes:
    """A download's body (an async iterator: ASGI sends it as it is read)."""
    assert response.is_async

    async def read() -> bytes:
        return b"".join([part async for part in response.streaming_content])

    return async_to_sync(read)()


def test_rename_download_and_delete(as_role, cluster):
    operator = as_role("operator")
    start(operator, cluster)
    capture = TrafficCapture.objects.get()
    fill(capture, 4)
    assert act(operator, cluster, capture, "rename", name="monday").status_code == 302
    assert act(operator, cluster, capture, "rename", name="").status_code == 400
    assert act(operator, cluster, capture, "explode").status_code == 404
    other = make_cluster(name="other-cluster")
    url = reverse("web:capture_action", args=[other.pk, capture.pk, "stop"])
    assert operator.post(url).status_code == 404  # not that cluster's capture

    download = as_role("viewer").get(reverse("web:capture_download", args=[cluster.pk, capture.pk]))
    assert download.status_code == 200
    assert "monday" in download["Content-Disposition"]
    rows = [json.loads(line) for line in streamed(download).splitlines()]
    assert [r["chat_id"] for r in rows] == [1, 2, 3, 4]
    assert [r["parent_chat_id"] for r in rows] == [-1, -1, 1, 2]
    assert rows[0]["hash_ids"][:20] == rows[1]["hash_ids"][:20]

    assert act(operator, cluster, capture, "delete", reason="gone").status_code == 302
    assert not TrafficCapture.objects.exists() and not CapturedRequest.objects.exists()
    actions = set(AuditEvent.objects.values_list("action", flat=True))
    assert {"capture.start", "capture.rename", "capture.download", "capture.delete"} <= actions


def test_a_capture_replays_from_the_replay_form(as_role, cluster, settings, tmp_path, monkeypatch):
    from controlplane.celery import app

    settings.SWITCHYARD_VAR_DIR = str(tmp_path)
    monkeypatch.setattr(app, "send_task", lambda name, **kw: None)
    operator = as_role("operator")
    start(operator, cluster)
    capture = TrafficCapture.objects.get()
    fill(capture, 12)
    page = operator.get(reverse("web:replays", args=[cluster.pk]) + f"?trace={capture.trace}")
    assert f'<option value="{capture.trace}" selected>' in page.content.decode()
    policies = [str(p.pk) for p in cluster.policies.order_by("name")]
    form = {"trace": capture.trace, "policies": policies, "seed": "0", "rate_scale": "1"}
    response = operator.post(reverse("web:replay_create", args=[cluster.pk]), form)
    assert response.status_code == 302, response.content.decode()[:400]
    job = ReplayJob.objects.get()
    fill(capture, 5, first=12)  # the capture goes on: the job replays it as it was
    assert run_replay(job.pk) == "succeeded"
    job.refresh_from_db()
    assert job.results is not None and len(job.results["policies"]) == 2
    assert job.results["requests"] == 12
    fidelity = job.results["fidelity"]  # the active lm replayed beside the live TTFT/TPOT
    assert fidelity["requests"] == 12 and fidelity["measured"] == 12
    ttft = next(m for m in fidelity["metrics"] if m["metric"] == "ttft_mean_s")
    assert ttft["live"] == pytest.approx(0.2) and ttft["replay"] > 0
    detail = operator.get(reverse("web:replay_detail", args=[cluster.pk, job.pk]))
    assert 'data-testid="replay-fidelity"' in detail.content.decode()
    missing = operator.post(
        reverse("web:replay_create", args=[cluster.pk]), form | {"trace": "capture:999999"}
    )
    assert missing.status_code == 400 and "does not exist" in missing.content.decode()


def test_replay_against_live_holds_each_policy_to_the_requests_it_served(
    as_role, cluster, settings, tmp_path, monkeypatch
):
    """A capture spanning two policies and a canary: the comparison takes the replayed
    policy that served the most requests on the whole cluster, and only those requests,
    live and replayed, and says which."""
    from controlplane.celery import app

    settings.SWITCHYARD_VAR_DIR = str(tmp_path)
    monkeypatch.setattr(app, "send_task", lambda name, **kw: None)
    operator = as_role("operator")
    start(operator, cluster)
    capture = TrafficCapture.objects.get()
    lm_version = config.latest_version(cluster).number  # type: ignore[union-attr]
    rr = cluster.policies.get(name="rr")
    policies.activate_policy(SYSTEM, cluster.pk, rr.pk, reason="try round robin")
    rr_version = config.latest_version(cluster).number  # type: ignore[union-attr]
    for index, blocks in enumerate((81541, 36800, None)):  # as the scraper stores them
        scrape = {"running": 0.0} if blocks is None else {"engine_kv_blocks": blocks}
        cluster.instances.filter(name=f"i{index}").update(last_scrape=scrape)
    fill(capture, 6, version=lm_version, arm="default", ttft=0.2)
    fill(capture, 4, first=6, version=rr_version, arm="default", ttft=5.0)
    fill(capture, 3, first=10, version=rr_version, arm="candidate", ttft=9.0)  # a canary arm
    policy_ids = [str(p.pk) for p in cluster.policies.order_by("name")]
    form = {"trace": capture.trace, "policies": policy_ids, "seeds": "2", "rate_scale": "1"}
    response = operator.post(reverse("web:replay_create", args=[cluster.pk]), form)
    assert response.status_code == 302, response.content.decode()[:400]
    job = ReplayJob.objects.get()
    assert job.inputs["num_gpu_blocks"] == 36800  # the smallest the engines reported
    selection = job.inputs["fidelity"]
    assert (selection["name"], selection["versions"]) == ("lm", [lm_version])
    assert (selection["requests"], selection["of"]) == (6, 13)
    assert run_replay(job.pk) == "succeeded"
    job.refresh_from_db()
    assert job.results is not None
    fidelity = job.results["fidelity"]
    assert (fidelity["policy"], fidelity["active"]) == ("lmetric", False)
    assert (fidelity["requests"], fidelity["of"], fidelity["measured"]) == (6, 13, 6)
    ttft = next(m for m in fidelity["metrics"] if m["metric"] == "ttft_mean_s")
    assert ttft["live"] == pytest.approx(0.2)  # neither round robin's 5 s nor the canary's 9 s
    lm_row = next(r for r in job.results["policies"] if r["kind"] == "lmetric")
    assert lm_row["selected"]["requests"] == 6  # the replay's same six requests
    assert ttft["replay"] == pytest.approx(lm_row["selected"]["ttft_mean_s"])
    page = operator.get(reverse("web:replay_detail", args=[cluster.pk, job.pk])).content.decode()
    assert 'data-testid="fidelity-scope"' in page and f"v{lm_version}" in page
    assert "the 6 of the replay's 13 captured requests that it routed" in page


def test_no_comparison_when_no_replayed_policy_served_the_capture_alone(
    as_role, cluster, settings, tmp_path, monkeypatch
):
    from controlplane.celery import app

    settings.SWITCHYARD_VAR_DIR = str(tmp_path)
    monkeypatch.setattr(app, "send_task", lambda name, **kw: None)
    operator = as_role("operator")
    start(operator, cluster)
    capture = TrafficCapture.objects.get()
    version = config.latest_version(cluster).number  # type: ignore[union-attr]
    fill(capture, 5, version=version, arm="baseline")  # canary arms only
    rr = cluster.policies.get(name="rr")
    form = {"trace": capture.trace, "policies": [str(rr.pk)], "seed": "0", "rate_scale": "1"}
    assert operator.post(reverse("web:replay_create", args=[cluster.pk]), form).status_code == 302
    job = ReplayJob.objects.get()
    assert job.inputs["fidelity"]["policy"] is None
    assert run_replay(job.pk) == "succeeded"
    job.refresh_from_db()
    assert job.results is not None and job.results["fidelity"]["requests"] == 0
    page = operator.get(reverse("web:replay_detail", args=[cluster.pk, job.pk])).content.decode()
    assert "there is nothing live to hold the replay against" in page


def test_a_download_is_streamed_in_bounded_chunks_and_audited(as_role, cluster, users, monkeypatch):
    """Under ASGI a sync iterator is read whole before it is sent; the
    download is an async iterator of chunks of a few rows (or block ids) each, with the
    same lines as the export a replay reads, and each download is audited."""
    from controlplane.services import captures

    operator = as_role("operator")
    start(operator, cluster)
    capture = TrafficCapture.objects.get()
    fill(capture, 7)
    monkeypatch.setattr(captures, "EXPORT_CHUNK", 3)
    monkeypatch.setattr(captures, "EXPORT_BLOCKS", 10_000)
    expected = "".join(captures.export_lines(capture)).encode()
    response = as_role("viewer").get(reverse("web:capture_download", args=[cluster.pk, capture.pk]))
    assert response.is_async

    async def chunks() -> list[bytes]:
        return [part async for part in response.streaming_content]

    parts = async_to_sync(chunks)()
    assert [part.count(b"\n") for part in parts] == [3, 3, 1]
    assert b"".join(parts) == expected
    monkeypatch.setattr(captures, "EXPORT_BLOCKS", 50)  # two rows of 22 blocks
    api = as_role("viewer").get(f"/api/v1/captures/{capture.pk}/trace")
    assert api.status_code == 200 and api.is_async

    async def api_chunks() -> list[bytes]:
        return [part async for part in api.streaming_content]

    parts = async_to_sync(api_chunks)()
    assert [part.count(b"\n") for part in parts] == [2, 2, 2, 1]
    assert b"".join(parts) == expected
    downloads = AuditEvent.objects.filter(action="capture.download", target_id=str(capture.pk))
    assert sorted(downloads.values_list("actor_name", flat=True)) == [users["viewer"].username] * 2
