from __future__ import annotations

import pytest

from devharness import free_port

pytestmark = pytest.mark.django_db


def test_healthz_ok_when_database_and_redis_answer(client) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "database": "ok", "redis": "ok"}


def test_healthz_names_redis_when_it_is_down(client, settings) -> None:
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    response = client.get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert body["database"] == "ok"
    assert body["redis"].startswith("down:")
    assert body["message"] == "redis unreachable"
