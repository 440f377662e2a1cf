"""The test settings keep parallel workers apart: each pytest-xdist worker gets a Redis
database of its own, even though it inherits the environment its controller set up."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _redis_url(**env: str) -> str:
    """REDIS_URL as a fresh process with this environment reads it from the test settings."""
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTEST_XDIST", "SWITCHYARD_REDIS"))
    }
    code = "from django.conf import settings; print(settings.REDIS_URL)"
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**clean, "DJANGO_SETTINGS_MODULE": "controlplane.settings_test", **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "redis://127.0.0.1:6379/9"),
        ({"PYTEST_XDIST_WORKER": "gw3"}, "redis://127.0.0.1:6379/13"),
        # what a worker inherits from its controller, which imported these settings first
        (
            {"PYTEST_XDIST_WORKER": "gw1", "SWITCHYARD_REDIS_URL": "redis://127.0.0.1:6379/9"},
            "redis://127.0.0.1:6379/11",
        ),
        # a URL chosen by hand (or by a drill for its own redis-server) is kept
        (
            {"PYTEST_XDIST_WORKER": "gw1", "SWITCHYARD_REDIS_URL": "redis://127.0.0.1:7001/0"},
            "redis://127.0.0.1:7001/0",
        ),
    ],
)
def test_each_parallel_worker_reads_its_own_redis_database(env, expected) -> None:
    assert _redis_url(**env) == expected
