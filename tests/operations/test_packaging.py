"""Each deployable installs only its part (pyproject's dependencies and extras): every
third-party module a deployable imports is declared by its install (not merely pulled in by
another package), a router host gets neither the control plane's nor the simulator's stack,
and its `routers` Celery worker loads with the `supervisor` extra alone."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tomllib
from functools import cache
from importlib.metadata import PackageNotFoundError, packages_distributions, requires
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
ROUTER_PACKAGES = ("router_worker", "chat_templates", "engine_interface")  # what a router host runs
HEAVY = {"django", "celery", "channels", "scipy", "matplotlib", "psycopg", "daphne"}
SIMULATOR_STACK = {"scipy", "matplotlib", "rich"}
# the packages of each deployable, and the extras its host installs
DEPLOYABLES = {
    # tracing: an optional extra, imported only when OTEL_* ask for traces
    # (router_worker/tracing.py; tests/router/test_tracing_units.py: untraced, none of it)
    "router": (ROUTER_PACKAGES, ("tracing",)),
    "enginesim": (("enginesim",), ("enginesim",)),
    "controlplane": (("controlplane",), ("controlplane",)),
}


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def requirements_of(*extras: str) -> frozenset[str]:
    """What ``pip install 'switchyard[extras]'`` asks for: the core dependencies and each
    extra's, with the extras that one names (``switchyard[...]``) expanded."""
    config = project()["project"]
    found = set(config["dependencies"])
    for extra in extras:
        for requirement in map(Requirement, config["optional-dependencies"][extra]):
            if requirement.name == "switchyard":
                found |= requirements_of(*requirement.extras)
            else:
                found.add(str(requirement))
    return frozenset(found)


def declared(*extras: str) -> set[str]:
    return {canonicalize_name(Requirement(r).name) for r in requirements_of(*extras)}


@cache
def installed_by(requirements: frozenset[str]) -> frozenset[str]:
    """The distributions pip installs for ``requirements``: each with its extras, and
    their dependencies in turn (markers evaluated for this interpreter)."""
    seen: set[tuple[str, str]] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        for extra in {"", *requirement.extras} - {e for n, e in seen if n == name}:
            seen.add((name, extra))
            try:
                dependencies = map(Requirement, requires(name) or [])
            except PackageNotFoundError:
                continue
            todo += [d for d in dependencies if not d.marker or d.marker.evaluate({"extra": extra})]
    return frozenset(name for name, _ in seen)


def first_party() -> set[str]:
    """The project's own top-level packages (pyproject's setuptools include list)."""
    include = project()["tool"]["setuptools"]["packages"]["find"]["include"]
    return {p.rstrip("*") for p in include}


def third_party_imports(package: str) -> set[str]:
    found: set[str] = set()
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return {m for m in found if m not in sys.stdlib_module_names and m not in first_party()}


def owners(module: str) -> set[str]:
    return {canonicalize_name(d) for d in packages_distributions().get(module, [])}


@pytest.mark.parametrize("deployable", DEPLOYABLES)
def test_every_direct_import_is_declared_by_the_deployables_install(deployable: str) -> None:
    packages, extras = DEPLOYABLES[deployable]
    names = declared(*extras)
    undeclared = {
        module: sorted(owners(module))
        for package in packages
        for module in third_party_imports(package)
        if not owners(module) & names
    }
    assert not undeclared, f"{deployable} imports what its install does not declare: {undeclared}"


def test_the_hot_path_parsers_are_declared_directly() -> None:
    assert {"httptools", "uvloop"} <= declared()


def test_a_router_host_gets_no_control_plane_or_simulator_stack() -> None:
    pulled = installed_by(requirements_of()) & HEAVY
    assert not pulled, f"the router's dependencies pull in {sorted(pulled)}"


# Loads what `celery -A controlplane worker -Q routers ... --supervise-routers` loads before it
# takes a task: the app, Django and its system checks (the URL conf with every view), the task
# modules, and the supervisor its bootstep starts. Any module not installed is absent.
ROUTERS_WORKER = """
import sys

ABSENT = frozenset(sys.argv[1].split(","))


class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ABSENT:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


sys.meta_path.insert(0, NotInstalled())
import celery.bin.celery
from controlplane.celery import app

app.loader.import_default_modules()
import controlplane.router_hosts.supervisor

print(sorted(app.tasks))
"""


def test_a_router_hosts_routers_worker_loads_with_the_supervisor_extra_alone() -> None:
    installed = installed_by(requirements_of("supervisor"))
    assert not installed & SIMULATOR_STACK
    absent = {
        module
        for module, distributions in packages_distributions().items()
        if module not in first_party()
        and not {canonicalize_name(d) for d in distributions} & installed
    }
    assert absent >= SIMULATOR_STACK  # the check below runs without them
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",
        "SWITCHYARD_SECRET_KEY": "test-only",
    }
    loaded = subprocess.run(
        [sys.executable, "-c", ROUTERS_WORKER, ",".join(sorted(absent))],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert loaded.returncode == 0, loaded.stderr
    assert "switchyard.restart_router" in loaded.stdout
