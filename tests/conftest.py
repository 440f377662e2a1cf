"""Fixtures shared by the whole suite. Everything here talks to real services."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from devharness import Fleet, Router
from tests.router.helpers import kv_fleet, launch_router

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
# Chromium flags for a closed network: without the background-networking ones it keeps
# trying to reach Google's hosts at every start.
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: object, ids: list[str]) -> None:
    """Tests sharing one node id run as one on parallel workers: stop before running any
    (the tests marked ``single_process`` run in a pytest of their own)."""
    twice = sorted(nodeid for nodeid, n in Counter(ids).items() if n > 1)
    if twice:
        pytest.exit(
            f"{len(twice)} node ids name several tests, which parallel workers would run once"
            f" (mark them single_process): {twice[:3]}",
            returncode=pytest.ExitCode.USAGE_ERROR,
        )


# Files that hold one parallel worker for a minute or more (seconds of one quiet `make test`,
# `--durations`). Parallel runs start them first: run last, the longest of them kept one
# worker busy for minutes after the other had finished. Order only; every test still runs.
# A run names the files that took a minute or more without being listed here.
LONG_FILES = {
    "tests/web/test_demo_walkthrough_browser.py": 250,
    "tests/drills/test_router_supervision_drills.py": 240,
    "tests/drills/test_stack_outages.py": 190,
    "tests/replay/test_invariant_scenarios.py": 150,
    "tests/web/test_canary_demo_browser.py": 130,
    "tests/operations/test_type_gate.py": 100,
    "tests/router/test_peers.py": 80,
    "tests/web/test_hostile_input.py": 80,
    "tests/web/test_e2e_browser.py": 75,
    "tests/web/test_new_params_hostile.py": 70,
    "tests/router/test_tenants_quota.py": 65,
    "tests/replay/test_kv_pressure.py": 65,
}
LONG_FILE_SECONDS = 60


def longest_files_first(nodeids: list[str]) -> list[int]:
    """Positions of ``nodeids`` reordered so LONG_FILES come first, longest first; each
    file's tests and the other files keep their order (a stable sort)."""
    weight = [LONG_FILES.get(nodeid.split("::", 1)[0], 0) for nodeid in nodeids]
    return sorted(range(len(nodeids)), key=lambda i: -weight[i])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The same order on every worker (xdist checks that the collections agree); the
    Makefile's ``--no-loadscope-reorder`` makes xdist hand out files in this order."""
    order = longest_files_first([item.nodeid for item in items])
    items[:] = [items[i] for i in order]


_file_seconds: dict[str, float] = {}


# The tests that passed in this session and those that failed: a session in which drills
# recorded rows (tests/drills, and the browser drill of tests/web) and none of the tests
# that record rows failed publishes them in the README.
_drills: dict[str, Any] = {"ran": set(), "failed": set(), "since": None}


def pytest_sessionstart(session: pytest.Session) -> None:
    _drills["since"] = time.strftime("%Y-%m-%d %H:%M:%S")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Called for every test here, and on the controller for its workers' tests too."""
    path = report.nodeid.split("::", 1)[0]
    _file_seconds[path] = _file_seconds.get(path, 0.0) + report.duration
    if report.failed:
        _drills["failed"].add(report.nodeid)
    elif report.when == "call" and report.passed:
        _drills["ran"].add(report.nodeid)


def _publish_drills(session: pytest.Session) -> None:
    """The README's drills table brought up to date (bench/drills/table.py), once per run:
    by the controller of parallel workers, or by the only process."""
    if hasattr(session.config, "workerinput"):
        return
    from bench.drills import table

    recorded = [
        row
        for row in table.load(table.RESULTS).values()
        if row.get("at", "") >= _drills["since"] and row.get("test") in _drills["ran"]
    ]
    if not recorded:
        return
    recording = {row.get("test") for row in [*recorded, *table.load(table.PUBLISHED).values()]}
    failed = recording & _drills["failed"]
    if failed:
        message = f"README drills table kept: {len(failed)} drill(s) failed"
    else:
        rows = table.publish(_drills["ran"], _drills["since"])
        message = f"README drills table rewritten: {rows} rows ({len(recorded)} new)"
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(message)


def _name_unlisted_long_files(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput"):
        return
    unlisted = {
        path: seconds
        for path, seconds in _file_seconds.items()
        if seconds >= LONG_FILE_SECONDS and path not in LONG_FILES
    }
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if unlisted and reporter is not None:
        named = ", ".join(f"{path} ({seconds:.0f} s)" for path, seconds in unlisted.items())
        reporter.write_line(f"long files not in tests/conftest.py's LONG_FILES: {named}")


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Publish the drills' rows; name long files the schedule does not know; drop what this
    run left queued on the broker (keys under the run's prefix)."""
    _publish_drills(session)
    _name_unlisted_long_files(session)
    from django.conf import settings

    prefix = settings.CELERY_BROKER_TRANSPORT_OPTIONS.get("global_keyprefix")
    if not prefix:
        return
    import redis

    try:
        client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
        for key in client.scan_iter(match=f"{prefix}*"):
            client.delete(key)
        client.close()
    except redis.RedisError:
        pass  # Redis was down at the end of the run: its keys are harmless


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """Debian's chromium driven by Playwright (its own browser download is unavailable here).

    Module-scoped: Playwright's sync API runs an event loop in this thread while it lives,
    which would stop pytest-asyncio from running the async tests of other modules."""
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: run `make test`, which installs Debian's chromium")
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop running in this thread, which makes Django's
    # async-safety guard refuse the test database teardown; the ORM calls here are sync.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield instance
        instance.close()


@pytest.fixture(scope="session")
def fleet() -> Iterator[Fleet]:
    """Four enginesim instances shared by the router tests and the drills: each test
    recovers the faults it injects (tests that must not share one start their own)."""
    with kv_fleet(4) as started:
        yield started


@pytest.fixture
def router_factory(tmp_path: Path) -> Iterator[Callable[..., Router]]:
    """Start router processes (tests/router/helpers.py's ``launch_router``); all stopped
    after the test."""
    started: list[Router] = []

    def start(document: dict[str, Any] | None = None, *extra: str, **options: Any) -> Router:
        router = launch_router(tmp_path, document, *extra, **options)
        started.append(router)
        return router

    yield start
    for router in started:
        router.stop()
