"""The layering rules (docs/architecture.md, "Layers and their rules") are import-linter
contracts (pyproject `[tool.importlinter]`, run by `make test`). These tests prove each
contract bites: a copy of the repo's packages with one forbidden import injected must fail
`lint-imports`, naming exactly that contract."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
CONTRACTS = {
    c["id"]: c["name"]
    for c in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
        "contracts"
    ]
}


def lint_imports(root: Path) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": str(root), "COLUMNS": "400", "NO_COLOR": "1"}
    done = subprocess.run(
        [str(LINT_IMPORTS), str(root / "pyproject.toml"), "--no-cache"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, " ".join((done.stdout + done.stderr).split())


def verdicts(output: str) -> dict[str, str]:
    """Contract id -> "KEPT" / "BROKEN" as `lint-imports` reports it."""
    found = {}
    for contract_id, name in CONTRACTS.items():
        for verdict in ("KEPT", "BROKEN"):
            if f"{name} {verdict}" in output:
                found[contract_id] = verdict
    return found


@pytest.fixture
def repo_copy(tmp_path: Path) -> Path:
    skip = shutil.ignore_patterns("__pycache__", "node_modules", "*.pyc")
    importlinter = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    for package in importlinter["root_packages"]:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=skip)
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_tree_keeps_every_contract() -> None:
    code, output = lint_imports(ROOT)
    assert code == 0, output
    assert verdicts(output) == dict.fromkeys(CONTRACTS, "KEPT"), output


# (file to edit, line appended, the contracts that must break — and only them). An import
# also breaks the contracts of every module that reaches it: replay-only-routing covers all
# of enginesim, the loadgen imports progress, the server imports chat_templates, and the
# router and routing import engine_interface, and the bench studies import bench.lib.
VIOLATIONS = [
    ("router_worker/dispatch.py", "import django", "router-no-django"),
    (
        "router_worker/contract/config.py",
        "from enginesim.engine import costmodel",
        "router-no-django",
    ),
    (
        "controlplane/services/clusters.py",
        "from router_worker import core",
        "control-plane-uses-the-router-contract",
    ),
    ("router_worker/app.py", "from controlplane import models", "router-no-django"),
    ("router_worker/routing/policies/linear.py", "import httpx", "policies-pure"),
    ("router_worker/routing/policies/lmetric.py", "import time", "policies-pure"),
    ("router_worker/routing/indicators.py", "import asyncio", "policies-pure"),
    (
        "router_worker/routing/hotspot.py",
        "from router_worker import decisions",
        "routing-self-contained control-plane-uses-the-router-contract",
    ),
    (
        "enginesim/engine/core.py",
        "from router_worker.routing import features",
        "engine-server-no-router replay-only-routing",
    ),
    (
        "enginesim/server/app.py",
        "import router_worker.metrics",
        "engine-server-no-router replay-only-routing",
    ),
    (
        "enginesim/replay/simulator.py",
        "from router_worker import decisions",
        "replay-only-routing control-plane-uses-the-router-contract",
    ),
    ("enginesim/engine/kvpool.py", "from enginesim.server import faults", "engine-knows-no-clock"),
    (
        "enginesim/progress.py",
        "import router_worker.routing",
        "replay-only-routing engine-server-no-router",
    ),
    ("engine_interface/kv_events.py", "import httpx", "engine-interface-neutral policies-pure"),
    ("engine_interface/__init__.py", "import django", "engine-interface-neutral router-no-django"),
    (
        "chat_templates/renderer.py",
        "import router_worker.routing",
        "chat-templates-neutral engine-server-no-router replay-only-routing",
    ),
    ("bench/hotspot/run.py", "import bench.replay.run", "bench-studies-independent"),
    (
        "bench/lib/stats.py",
        "import bench.replay.run",
        "bench-lib-below-studies bench-studies-independent",
    ),
]


@pytest.mark.parametrize(
    ("path", "line", "contracts"), VIOLATIONS, ids=[f"{c.split()[0]}:{p}" for p, _, c in VIOLATIONS]
)
def test_a_forbidden_import_breaks_its_contract(
    repo_copy: Path, path: str, line: str, contracts: str
) -> None:
    target = repo_copy / path
    target.write_text(target.read_text() + f"\n{line}  # injected by test_layering\n")
    code, output = lint_imports(repo_copy)
    assert code != 0, output
    broken = {cid for cid, verdict in verdicts(output).items() if verdict == "BROKEN"}
    assert broken == set(contracts.split()), output
    assert f"(l.{len(target.read_text().splitlines())})" in output, output


def test_the_control_plane_may_import_no_router_module_but_the_contract_and_routing() -> None:
    """The contract forbids every child of router_worker but two by name: a module added to
    the router is forbidden to the control plane from the start, or this fails."""
    contract = next(
        c
        for c in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
            "contracts"
        ]
        if c["id"] == "control-plane-uses-the-router-contract"
    )
    package = ROOT / "router_worker"
    children = {
        f"router_worker.{p.stem if p.is_file() else p.name}"
        for p in package.iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()
    }
    allowed = {"router_worker.contract", "router_worker.routing"}
    assert set(contract["forbidden_modules"]) == children - allowed


def test_the_control_planes_services_and_selectors_import_each_other_in_no_circle() -> None:
    """A circle among the services (captures, clusters, config, ingest imported each other,
    some of it hidden in function-level imports) makes any of them hard to change alone."""
    import grimp

    graph = grimp.build_graph("controlplane")
    layer = {
        m
        for m in graph.modules
        if m.startswith(("controlplane.services", "controlplane.selectors"))
    }
    circles = sorted(
        (importer, imported)
        for importer in layer
        for imported in graph.find_modules_directly_imported_by(importer) & layer
        if graph.find_shortest_chain(importer=imported, imported=importer)
    )
    assert circles == []
