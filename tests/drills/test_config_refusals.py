"""Drill: the router's own POST /admin/config refuses invalid policy parameters and
inconsistent canary splits with a 400 naming the field, and keeps routing on the old
configuration. (The control plane's refusals are in tests/controlplane/test_validation.py.)"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.drills.clients import MODEL, is_error_body
from tests.drills.helpers import drill_config
from tests.drills.report import Outcome, record
from tests.router.helpers import launch_router

ROUND_ROBIN = {"kind": "round_robin"}
LMETRIC = {"kind": "lmetric"}


def _arms(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    base = {"name": "baseline", "weight": 50, "instances": ["i0", "i1"], "policy": ROUND_ROBIN}
    cand = {"name": "candidate", "weight": 50, "instances": ["i2", "i3"], "policy": LMETRIC}
    return {"arms": [{**base, **first}, {**cand, **second}]}


CASES: list[tuple[str, dict[str, Any], str]] = [
    ("policy w out of range", {"policy": {"kind": "linear", "params": {"w": 7}}}, ".w: "),
    (
        "policy param wrong type",
        {"policy": {"kind": "smetric", "params": {"slo_ttft_s": "fast"}}},
        "slo_ttft_s",
    ),
    ("policy unknown param", {"policy": {"kind": "cache_aware", "params": {"bogus": 1}}}, "bogus"),
    ("policy unknown kind", {"policy": {"kind": "fastest"}}, "unknown policy kind"),
    ("weights sum to 90", {"canary": _arms({"weight": 40}, {})}, "weight must sum to 100"),
    ("weights sum to 110", {"canary": _arms({"weight": 60}, {})}, "weight must sum to 100"),
    ("negative weight", {"canary": _arms({"weight": -10}, {"weight": 110})}, "weight"),
    (
        "overlapping subsets",
        {"canary": _arms({}, {"instances": ["i1", "i2"]})},
        "arms.instances overlap",
    ),
    ("empty subset", {"canary": _arms({}, {"instances": []})}, "instances"),
    ("unknown instance in arm", {"canary": _arms({}, {"instances": ["i9"]})}, "i9"),
    ("duplicate arm names", {"canary": _arms({}, {"name": "baseline"})}, "arms.name"),
    ("one arm only", {"canary": {"arms": _arms({}, {})["arms"][:1]}}, "canary.arms"),
]


@pytest.fixture(scope="module")
def router(drill_fleet, tmp_path_factory):
    document = {**drill_config(drill_fleet, "round_robin"), "version": 5}
    started = launch_router(tmp_path_factory.mktemp("refusals"), document)
    yield started
    started.stop()


def test_router_refuses_invalid_configs_naming_the_field(router, drill_fleet):
    outcome = Outcome()
    url = router.url + "/admin/config"
    for label, change, named in CASES:
        document = {**drill_config(drill_fleet, "round_robin"), "version": 6, **change}
        response = httpx.post(url, json=document, headers=router.admin_headers, timeout=10)
        message = response.json()["error"]["message"] if is_error_body(response.text) else ""
        refused = response.status_code == 400 and named in message
        outcome.add("clear" if refused else "lost", f"{label}: {response.status_code} {message}")
    applied = httpx.get(url, headers=router.admin_headers, timeout=10).json()
    routed = httpx.post(
        router.url + "/v1/completions",
        timeout=30,
        json={"model": MODEL, "prompt": "still routing", "max_tokens": 2},
    )
    record(
        "invalid policy/canary config to router",
        outcome,
        None,
        notes="each refused 400 naming the field; old config v5 kept",
    )
    assert outcome.lost == 0, outcome.lost_examples
    assert applied["version"] == 5 and applied["canary"] is None
    assert routed.status_code == 200
