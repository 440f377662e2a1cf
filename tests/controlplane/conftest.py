"""Control-plane fixtures: the world (built once per module), its users, and clients acting
as a role. Their helpers: tests/controlplane/helpers.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import transaction

from tests.controlplane.helpers import ROLES, World, build_world, make_user, session_client


@pytest.fixture(scope="module")
def module_world(django_db_setup, django_db_blocker) -> Iterator[World]:
    """Built once per module inside a transaction that is rolled back at its end; each test
    runs in a savepoint inside it (pytest-django's `db`), so tests still cannot see each
    other's writes while the ~250 queries of the build are paid once."""
    with django_db_blocker.unblock(), transaction.atomic():
        world = build_world()
        world.users = {role: make_user(role) for role in ROLES}  # type: ignore[attr-defined]
        yield world
        transaction.set_rollback(True)


@pytest.fixture
def world(module_world: World, db) -> World:
    return module_world


@pytest.fixture
def users(world: World) -> dict:
    return world.users  # type: ignore[attr-defined]


@pytest.fixture
def as_role(users):
    """as_role("operator") -> a logged-in client; as_role(None) -> anonymous."""
    return lambda role: session_client(users[role] if role else None)


@pytest.fixture
def replay_dispatches(monkeypatch) -> list:
    """Record replay tasks instead of sending them to the broker."""
    from controlplane.celery import app

    sent: list = []
    monkeypatch.setattr(app, "send_task", lambda name, *args, **kw: sent.append((name, args, kw)))
    return sent
