"""`make test` runs mypy with pyproject's `[tool.mypy]`. These snippets prove the gate bites
on the mistakes the annotations exist for, and stays quiet on correct code."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def mypy(tmp_path: Path, source: str) -> tuple[int, str]:
    snippet = tmp_path / "snippet.py"
    snippet.write_text(source)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), str(snippet)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.returncode, done.stdout + done.stderr


METRICS = """from router_worker.metrics import RouterMetrics

metrics = RouterMetrics()
"""


def test_a_metric_child_keeps_its_family_type(tmp_path: Path) -> None:
    code, output = mypy(
        tmp_path,
        METRICS
        + 'metrics.child(metrics.requests, "p", "a", "r", "s").inc()\n'
        + 'metrics.child(metrics.ttft, "arm").observe(0.1)\n',
    )
    assert code == 0, output


def test_observing_a_counter_fails(tmp_path: Path) -> None:
    code, output = mypy(
        tmp_path, METRICS + 'metrics.child(metrics.requests, "p", "a", "r", "s").observe(1.0)\n'
    )
    assert code == 1, output
    assert '"Counter" has no attribute "observe"' in output, output


STATE = """from router_worker.routing import ClusterState

state = ClusterState()
"""


def test_cluster_state_arrays_are_declared(tmp_path: Path) -> None:
    code, output = mypy(
        tmp_path, STATE + "total = float(state.pending.sum() + state.kv_usage[0])\n"
    )
    assert code == 0, output
    code, output = mypy(tmp_path, STATE + "total = float(state.pendin.sum())\n")
    assert code == 1, output
    assert '"ClusterState" has no attribute "pendin"' in output, output


CLUSTER = """from controlplane.models import Cluster


def instance_names(cluster: Cluster) -> list[str]:
"""


def test_the_control_plane_is_checked_with_the_django_plugin(tmp_path: Path) -> None:
    # a reverse relation (related_name) exists only through django-stubs' plugin
    code, output = mypy(
        tmp_path, CLUSTER + "    return [i.name for i in cluster.instances.all()]\n"
    )
    assert code == 0, output
    code, output = mypy(
        tmp_path, CLUSTER + "    return [i.nmae for i in cluster.instances.all()]\n"
    )
    assert code == 1, output
    assert '"Instance" has no attribute "nmae"' in output, output


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
