"""`scripts/demo.py` without its stack: the banner it prints, and the canary schedule it
gives the control plane (the seeded canary and every canary the form creates get it)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from controlplane.models import CanarySplit
from controlplane.services import canaries, demo

ROOT = Path(__file__).resolve().parents[2]
LOGINS = {"cluster": "1", "operator": "op-pw", "admin": "admin-pw", "pd_cluster": "2"}


@pytest.fixture(scope="module")
def script() -> ModuleType:
    """scripts/demo.py as a module (importing it starts nothing)."""
    spec = importlib.util.spec_from_file_location("demo_script", ROOT / "scripts" / "demo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["demo_script"] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop("demo_script", None)
    return module


def state_line(banner: str) -> str:
    (line,) = [line for line in banner.splitlines() if line.startswith("  state:")]
    return line


def test_a_fresh_banner_says_what_was_emptied_and_how_to_keep_it(script) -> None:
    logins = {**LOGINS, "reset": "database switchyard, Redis redis://127.0.0.1:6379/0"}
    banner = script.banner(logins)
    assert state_line(banner) == (
        "  state:     fresh (emptied the earlier run's database switchyard, Redis "
        "redis://127.0.0.1:6379/0 and the routers' saved configs; `make demo KEEP=1` keeps them)"
    )
    assert "operator / op-pw   (admin / admin-pw)" in banner
    assert banner.rstrip().endswith("Press Ctrl-C to stop everything.")


def test_a_kept_banner_finishes_its_sentence(script) -> None:
    line = state_line(script.banner({**LOGINS, "reset": ""}))
    assert line == (
        "  state:     kept from the earlier run (KEEP=1); the demo's seed only adds what is "
        "missing (instances, policies, a draft canary, a running capture) and issues new "
        "passwords"
    )


def test_the_demo_gives_the_control_plane_its_canary_schedule(script, monkeypatch) -> None:
    monkeypatch.delenv("SWITCHYARD_CANARY_DEFAULTS", raising=False)
    given = json.loads(script.stack_env()["SWITCHYARD_CANARY_DEFAULTS"])
    # one step of half the traffic, 20 samples per arm, judged after 30 s (the README's)
    assert given == {"weight_steps": [50], "min_samples": 20, "step_seconds": 30}


def test_the_seeded_canary_takes_the_demo_schedule(script, settings, db) -> None:
    settings.SWITCHYARD_CANARY_DEFAULTS = script.DEMO_CANARY_DEFAULTS
    canaries.site_defaults.cache_clear()
    try:
        demo.seed(demo.DemoSpec(cluster="demo-schedule", instances=4, kv_events_base_port=None))
    finally:
        canaries.site_defaults.cache_clear()
    seeded = CanarySplit.objects.get(cluster__name="demo-schedule")
    assert seeded.weight_steps == [50.0]
    assert seeded.guardrails["min_samples"] == 20 and seeded.guardrails["step_seconds"] == 30
    assert seeded.guardrails["max_wait_seconds"] == 600  # inconclusive steps still wait
