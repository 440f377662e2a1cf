"""The Django admin lists every model; append-only and immutable records are read-only."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.test import Client

from controlplane import models

pytestmark = pytest.mark.django_db
READ_ONLY = {models.AuditEvent, models.HotspotEvent, models.RouterEvent, models.ConfigVersion,
             models.CanaryJudgement, models.ClientKey}
# Written by the system (tokens via `manage.py create_api_token`, rollups by ingest).
NOT_ADDABLE = {models.ApiToken, models.ArmMetricRollup, models.InstanceMetricRollup,
               models.IngestedRecord}


@pytest.fixture
def superuser_client(world) -> Client:
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("root", password=None))
    return client


def test_every_model_is_registered() -> None:
    assert {getattr(models, name) for name in models.__all__} <= set(admin.site._registry)


@pytest.mark.parametrize("model", [getattr(models, n) for n in models.__all__],
                         ids=lambda m: m.__name__)
def test_changelist_renders(superuser_client, model) -> None:
    url = f"/admin/controlplane/{model._meta.model_name}/"
    response = superuser_client.get(url)
    assert response.status_code == 200
    can_add = f"{url}add/" in response.content.decode()
    assert can_add is (model not in READ_ONLY and model not in NOT_ADDABLE)


def test_config_version_cannot_be_changed_in_the_admin(superuser_client, world) -> None:
    version = models.ConfigVersion.objects.filter(cluster_id=world["alpha"]).first()
    url = f"/admin/controlplane/configversion/{version.pk}/change/"
    response = superuser_client.post(url, {"reason": "edited"})
    assert response.status_code == 403
    version.refresh_from_db()
    assert version.reason != "edited"
