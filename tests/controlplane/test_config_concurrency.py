"""Config version numbers stay consecutive when changes race (the cluster row lock).

Its own module: it needs committed data visible to other connections, so it cannot run
inside the module-wide world transaction of the other modules."""

from __future__ import annotations

import threading

import pytest
from django.db import connections

from controlplane.models import ConfigVersion
from controlplane.services import clusters

from .helpers import SYSTEM, make_cluster


@pytest.mark.django_db(transaction=True)
def test_concurrent_changes_get_distinct_consecutive_numbers() -> None:
    cluster, parts = make_cluster("race", [f"n{i}" for i in range(6)])
    errors: list[Exception] = []

    def drain(instance_id: int) -> None:
        try:
            clusters.set_instance_state(SYSTEM, instance_id, "draining", reason="race")
        except Exception as error:  # reported by the assertion below
            errors.append(error)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=drain, args=(i.pk,)) for i in parts["instances"].values()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == []
    assert list(
        ConfigVersion.objects.filter(cluster=cluster)
        .order_by("number")
        .values_list("number", flat=True)
    ) == list(range(1, 1 + 1 + len(threads)))
