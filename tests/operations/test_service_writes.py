"""Control-plane writes go through services — one transaction, one audit row, then the live
broadcast on commit. So no module of the control plane outside ``controlplane/services/``
(and its migrations) writes through the ORM: views, API handlers, Celery tasks, the
realtime layer and management commands call a service instead. The check reads the source
(an AST walk), so a write on a path no test exercises is caught too."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONTROLPLANE = ROOT / "controlplane"
ALLOWED = ("services", "migrations")

# Manager/queryset methods that write; `update` only on a queryset (dicts have one too).
ALWAYS_WRITES = {"bulk_create", "bulk_update", "get_or_create", "update_or_create", "create"}
QUERYSET_STEPS = {"objects", "filter", "exclude", "all", "select_for_update", "order_by"}


def _receiver_steps(node: ast.expr) -> set[str]:
    """Attribute and method names along a receiver chain like ``A.objects.filter(...)``."""
    steps = set()
    while True:
        if isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Attribute):
            steps.add(node.attr)
            node = node.value
        else:
            return steps


def _is_write(call: ast.Call) -> bool:
    func = call.func
    if not isinstance(func, ast.Attribute):
        return False
    if func.attr == "save":
        return not (isinstance(func.value, ast.Call) and _is_super(func.value))
    if func.attr == "delete":
        return not call.args  # instance.delete() / queryset.delete(); routes.delete("/x") is not
    if func.attr in ALWAYS_WRITES:
        return True
    return func.attr == "update" and bool(_receiver_steps(func.value) & QUERYSET_STEPS)


def _is_super(call: ast.Call) -> bool:
    return isinstance(call.func, ast.Name) and call.func.id == "super"


def orm_writes(source: str, filename: str = "<source>") -> list[str]:
    """``file:line: code`` of every ORM write in ``source``."""
    tree = ast.parse(source, filename)
    return [
        f"{filename}:{node.lineno}: {ast.unparse(node)[:80]}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and _is_write(node)
    ]


def control_plane_modules_outside_services() -> list[Path]:
    return [
        path
        for path in sorted(CONTROLPLANE.rglob("*.py"))
        if path.relative_to(CONTROLPLANE).parts[0] not in ALLOWED
    ]


def test_no_control_plane_module_outside_services_writes_through_the_orm() -> None:
    modules = control_plane_modules_outside_services()
    assert len(modules) > 20  # the walk found the control plane
    found = [
        write
        for path in modules
        for write in orm_writes(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert found == [], "\n".join(found)


def test_the_check_sees_each_kind_of_write() -> None:
    source = """
def view(request, cluster):
    cluster.name = "x"
    cluster.save()
    cluster.instances.create(name="i0")
    Cluster.objects.filter(pk=1).update(name="y")
    Instance.objects.get_or_create(name="i1")
    cluster.delete()
"""
    assert [line.split(": ", 1)[1] for line in orm_writes(source)] == [
        "cluster.save()",
        "cluster.instances.create(name='i0')",
        "Cluster.objects.filter(pk=1).update(name='y')",
        "Instance.objects.get_or_create(name='i1')",
        "cluster.delete()",
    ]


def test_the_check_leaves_reads_dicts_and_routes_alone() -> None:
    source = """
@routes.delete("/clusters/{name}")
def remove(request, name):
    env = {}
    env.update(a=1)
    app.conf.update(task_acks_late=True)
    return Cluster.objects.filter(name=name).first()

class Model:
    def save(self, *args, **kwargs):
        super().save(*args, **kwargs)
"""
    assert orm_writes(source) == []
