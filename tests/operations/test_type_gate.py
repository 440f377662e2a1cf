"""`make test` runs mypy with pyproject's `[tool.mypy]`. These snippets prove the gate bites
on the mistakes the annotations exist for, and stays quiet on correct code."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


METRICS = """from router_worker.metrics import RouterMetrics

metrics = RouterMetrics()
"""
STATE = """from router_worker.routing import ClusterState

state = ClusterState()
"""
CLUSTER = """from controlplane.models import Cluster


def instance_names(cluster: Cluster) -> list[str]:
"""

# Every snippet is checked by one mypy run (each run loads numpy's and Django's stubs, which
# is most of its time); each test reads its own snippets' verdicts.
SNIPPETS = {
    "metric_child_ok": METRICS
    + 'metrics.child(metrics.requests, "p", "a", "r", "s").inc()\n'
    + 'metrics.child(metrics.ttft, "arm").observe(0.1)\n',
    "counter_observed": METRICS
    + 'metrics.child(metrics.requests, "p", "a", "r", "s").observe(1.0)\n',
    "state_ok": STATE + "total = float(state.pending.sum() + state.kv_usage[0])\n",
    "state_typo": STATE + "total = float(state.pendin.sum())\n",
    "relation_ok": CLUSTER + "    return [i.name for i in cluster.instances.all()]\n",
    "relation_typo": CLUSTER + "    return [i.nmae for i in cluster.instances.all()]\n",
}


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Each snippet's error lines from one mypy run over all of them."""
    folder = tmp_path_factory.mktemp("snippets")
    for name, source in SNIPPETS.items():
        (folder / f"{name}.py").write_text(source)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            *sorted(str(folder / f"{name}.py") for name in SNIPPETS),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode in (0, 1), done.stdout + done.stderr  # 2: mypy itself failed
    errors: dict[str, list[str]] = {name: [] for name in SNIPPETS}
    for line in done.stdout.splitlines():
        stem = Path(line.split(":", 1)[0]).stem
        if stem in errors and ": error:" in line:
            errors[stem].append(line)
    return errors


def test_a_metric_child_keeps_its_family_type(verdicts: dict[str, list[str]]) -> None:
    assert verdicts["metric_child_ok"] == []


def test_observing_a_counter_fails(verdicts: dict[str, list[str]]) -> None:
    assert any(
        '"Counter" has no attribute "observe"' in line for line in verdicts["counter_observed"]
    ), verdicts["counter_observed"]


def test_cluster_state_arrays_are_declared(verdicts: dict[str, list[str]]) -> None:
    assert verdicts["state_ok"] == []
    assert any(
        '"ClusterState" has no attribute "pendin"' in line for line in verdicts["state_typo"]
    ), verdicts["state_typo"]


def test_the_control_plane_is_checked_with_the_django_plugin(
    verdicts: dict[str, list[str]],
) -> None:
    # a reverse relation (related_name) exists only through django-stubs' plugin
    assert verdicts["relation_ok"] == []
    assert any(
        '"Instance" has no attribute "nmae"' in line for line in verdicts["relation_typo"]
    ), verdicts["relation_typo"]


def test_every_python_file_is_checked() -> None:
    checked = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["files"])
    found = {
        top.name
        for top in ROOT.iterdir()
        if not top.name.startswith(".")
        for path in ([top] if top.is_file() else top.rglob("*.py"))
        if path.suffix == ".py" and "node_modules" not in path.parts
    }
    assert found <= checked, f"not in [tool.mypy] files: {sorted(found - checked)}"
