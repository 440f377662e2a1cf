"""A router host installs the package alone: every import of router_worker must come from
the core dependencies (or what they pull in), and the core must not pull in the control
plane's or the simulator's stack."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from functools import cache
from importlib.metadata import PackageNotFoundError, packages_distributions, requires
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROUTER_PACKAGES = ("router_worker", "chat_templates", "engine_interface")  # what a router host runs
HEAVY = {"django", "celery", "channels", "scipy", "matplotlib", "psycopg", "daphne"}


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def core_requirements() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {_name(r) for r in project["dependencies"]}


@cache
def _closure(names: frozenset[str]) -> frozenset[str]:
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            reqs = requires(name) or []
        except PackageNotFoundError:
            continue
        todo += [_name(r) for r in reqs if "extra ==" not in r]
    return frozenset(seen)


def third_party_imports(package: str) -> set[str]:
    found: set[str] = set()
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return {m for m in found if m not in sys.stdlib_module_names and m not in first_party()}


def first_party() -> set[str]:
    """The project's own top-level packages (pyproject's setuptools include list)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {p.rstrip("*") for p in config["tool"]["setuptools"]["packages"]["find"]["include"]}


def test_every_router_import_is_installed_by_the_core_dependencies() -> None:
    closure = _closure(frozenset(core_requirements()))
    owners = packages_distributions()
    missing = {
        module: owners.get(module)
        for package in ROUTER_PACKAGES
        for module in third_party_imports(package)
        if not {_name(d) for d in owners.get(module, [])} & closure
    }
    assert not missing, f"router_worker imports packages the core does not install: {missing}"


def test_the_hot_path_parsers_are_declared_directly() -> None:
    assert {"httptools", "uvloop"} <= core_requirements()


def test_a_router_host_gets_no_control_plane_or_simulator_stack() -> None:
    pulled = _closure(frozenset(core_requirements())) & HEAVY
    assert not pulled, f"the router's dependencies pull in {sorted(pulled)}"
