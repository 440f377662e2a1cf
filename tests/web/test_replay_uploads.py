"""Uploaded and shared traces are checked row by row before a replay spends memory on them;
refused uploads are deleted at once and old ones on a schedule; a replay that runs out of
memory fails its job with a clear error and leaves its worker alive."""

from __future__ import annotations

import html
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from controlplane.models import Cluster, ReplayJob
from controlplane.services.traces import uploads_dir
from controlplane.tasks.maintenance import prune_uploads
from tests.web.helpers import ROOT, policy_ids, subprocess_env

if TYPE_CHECKING:  # the stubs' name for what the test client answers
    from django.test.client import _MonkeyPatchedWSGIResponse

pytestmark = pytest.mark.django_db
TRILLION = 10**12


def mooncake(*lengths: int) -> bytes:
    rows = [
        {
            "timestamp": 100 * k,
            "input_length": n,
            "output_length": 8,
            "hash_ids": [k * 10 + b for b in range(3)],
        }
        for k, n in enumerate(lengths)
    ]
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def create(client: Client, cluster: Cluster, **form: Any) -> _MonkeyPatchedWSGIResponse:
    return client.post(reverse("web:replay_create", args=[cluster.pk]), form)


def stored_uploads() -> list[str]:
    folder = uploads_dir()
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def test_a_row_asking_for_a_trillion_tokens_is_refused_with_its_row_number(
    as_role, cluster, traces, dispatched
) -> None:
    upload = SimpleUploadedFile("huge.jsonl", mooncake(1000, 2000, TRILLION, 500))
    response = create(as_role("operator"), cluster, upload=upload, policies=policy_ids(cluster)[:1])
    assert response.status_code == 400
    text = response.content.decode()
    assert "trace row 3: input_length 1000000000000 is over 524288 tokens" in text
    assert "32768-token context" in text
    assert not ReplayJob.objects.exists() and not dispatched
    assert stored_uploads() == []  # the refused file is not kept


@pytest.mark.parametrize(
    ("row", "says"),
    [
        (
            {"timestamp": 0, "input_length": -5, "output_length": 1, "hash_ids": []},
            "input_length -5 is not a token count",
        ),
        (
            {"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [-1]},
            "hash_ids holds -1",
        ),
        (
            {"timestamp": "soon", "input_length": 10, "output_length": 1, "hash_ids": []},
            "timestamp 'soon' is not a time",
        ),
    ],
)
def test_malformed_rows_are_refused_by_line(
    as_role,
    cluster,
    traces,
    dispatched,
    row,
    says,
) -> None:
    body = mooncake(10) + (json.dumps(row) + "\n").encode()
    response = create(
        as_role("operator"),
        cluster,
        policies=policy_ids(cluster)[:1],
        upload=SimpleUploadedFile("bad.jsonl", body),
    )
    assert response.status_code == 400
    assert f"trace row 2: {says}" in html.unescape(response.content.decode())
    assert stored_uploads() == []


def test_an_upload_refused_for_another_reason_is_deleted_too(
    as_role, cluster, traces, dispatched
) -> None:
    upload = SimpleUploadedFile("fine.jsonl", mooncake(1000, 2000))
    response = create(as_role("operator"), cluster, upload=upload)  # no policy chosen
    assert response.status_code == 400 and b"policies must list" in response.content
    assert stored_uploads() == []


def test_an_accepted_upload_is_kept_for_its_job(as_role, cluster, traces, dispatched) -> None:
    upload = SimpleUploadedFile("fine.jsonl", mooncake(1000, 2000))
    response = create(as_role("operator"), cluster, upload=upload, policies=policy_ids(cluster)[:1])
    assert response.status_code == 302
    assert [f"upload:{name}" for name in stored_uploads()] == [
        ReplayJob.objects.get().inputs["trace"]
    ]


ROW = '"input_length": 10, "output_length": 2, "hash_ids": [1]'
CSV_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


@pytest.mark.parametrize(
    ("name", "body", "says"),
    [
        ("deep.jsonl", '{"a":' * 200_000 + "1" + "}" * 200_000 + "\n", "nested too deep"),
        (
            "deep-second.jsonl",
            '{"timestamp": 0, ' + ROW + "}\n" + "[" * 200_000 + "]" * 200_000 + "\n",
            "trace row 2: JSON nested too deep",
        ),
        ("digits.jsonl", '{"timestamp": ' + "9" * 400 + ", " + ROW + "}\n", "is not a time"),
        (
            "wide.csv",
            CSV_HEAD + "2024-01-01 00:00:00,10,2\n" + "x" * (200 * 1024) + ",1,1\n",
            "not CSV",
        ),
    ],
)
def test_hostile_uploads_get_a_400_and_leave_nothing_on_disk(
    as_role, cluster, traces, dispatched, name, body, says
) -> None:
    upload = SimpleUploadedFile(name, body.encode())
    response = create(as_role("operator"), cluster, upload=upload, policies=policy_ids(cluster)[:1])
    assert response.status_code == 400
    assert says in response.content.decode()
    assert stored_uploads() == [] and not ReplayJob.objects.exists()


def test_old_uploads_are_pruned_unless_a_pending_job_needs_them(
    cluster,
    traces,
    settings,
) -> None:
    uploads_dir().mkdir(parents=True)
    for name in ("old.jsonl", "old-pending.jsonl", "fresh.jsonl"):
        (uploads_dir() / name).write_bytes(mooncake(10))
    month_ago = time.time() - 30 * 86400
    for name in ("old.jsonl", "old-pending.jsonl"):
        os.utime(uploads_dir() / name, (month_ago, month_ago))
    ReplayJob.objects.create(cluster=cluster, inputs={"trace": "upload:old-pending.jsonl"})
    settings.SWITCHYARD_UPLOAD_RETENTION_DAYS = 7
    assert prune_uploads() == 1
    assert stored_uploads() == ["fresh.jsonl", "old-pending.jsonl"]


def test_old_capture_exports_are_pruned_unless_a_pending_job_reads_them(
    cluster, traces, settings
) -> None:
    """Every replay of a capture writes an export: it must not stay forever."""
    from controlplane.services.traces import captures_dir

    captures_dir().mkdir(parents=True)
    names = ("7-100.jsonl", "7-200.jsonl", "8.jsonl", "7-300.jsonl")
    for name in names:
        (captures_dir() / name).write_text("{}\n")
    two_days_ago = time.time() - 2 * 86400
    for name in names[:3]:
        os.utime(captures_dir() / name, (two_days_ago, two_days_ago))
    ReplayJob.objects.create(cluster=cluster, inputs={"trace": "capture:7", "capture_until": 200})
    assert prune_uploads() == 2
    assert sorted(p.name for p in captures_dir().iterdir()) == ["7-200.jsonl", "7-300.jsonl"]


# ----------------------------------------------------------------- in a worker process

# Runs the replay task in its own process with its address space capped a little above
# what it uses once warmed up, as a worker short of memory would be: an allocation the
# replay needs then fails for real (MemoryError) instead of exhausting the machine.
RUN_CAPPED = """
import os, resource, sys
import django
django.setup()
import enginesim.replay.metrics, enginesim.replay.simulator, enginesim.replay.traces
from controlplane.models import ReplayJob
from controlplane.tasks.replay import run_replay
ReplayJob.objects.filter(pk=-1).exists()  # connect before the cap
size = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status")
            if l.startswith("VmSize:"))
cap = size + int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
print("STATE", run_replay(int(sys.argv[1])))
"""


def run_capped(job: ReplayJob, headroom: int) -> subprocess.CompletedProcess[str]:
    env = {
        **subprocess_env(),
        "SWITCHYARD_VAR_DIR": os.environ.get("SWITCHYARD_VAR_DIR", ""),
        "SWITCHYARD_TRACES_DIR": os.environ["SWITCHYARD_TRACES_DIR"],
    }
    return subprocess.run(
        [sys.executable, "-c", RUN_CAPPED, str(job.pk), str(headroom)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def shared_job(cluster, traces: Path, body: bytes) -> ReplayJob:
    (traces / "edited.jsonl").write_bytes(body)
    policy = cluster.policies.get(name="rr")
    return ReplayJob.objects.create(
        cluster=cluster,
        inputs={
            "trace": "shared:edited.jsonl",
            "rate_scale": 1.0,
            "seed": 0,
            "policies": [{"kind": policy.kind, "params": policy.params}],
        },
    )


@pytest.mark.django_db(transaction=True)
def test_a_trace_broken_after_the_job_was_made_fails_the_job_by_row(cluster, traces) -> None:
    job = shared_job(cluster, traces, mooncake(1000, TRILLION))
    done = run_capped(job, 512 * 1024 * 1024)
    assert "STATE failed" in done.stdout, done.stderr[-3000:]
    job.refresh_from_db()
    assert job.error.startswith("trace row 2: input_length 1000000000000 is over")


@pytest.mark.django_db(transaction=True)
def test_a_replay_out_of_memory_fails_its_job_and_the_worker_lives_on(cluster, traces) -> None:
    job = shared_job(cluster, traces, mooncake(500_000))  # within bounds, ~12 MB of tokens
    done = run_capped(job, 4 * 1024 * 1024)
    assert done.returncode == 0 and "STATE failed" in done.stdout, done.stderr[-3000:]
    job.refresh_from_db()
    assert (job.state, job.error) == (
        "failed",
        "the replay ran out of memory on its worker; "
        "choose fewer requests (max requests) or a smaller trace",
    )
