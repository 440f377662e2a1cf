"""Canary guardrails: one typed model (controlplane/services/guardrails.py) behind the API,
the form and ``SWITCHYARD_CANARY_DEFAULTS``; each bad value is refused naming its field.

``min_samples: 0`` was once accepted by all three, and a canary stored with it passed
steps without data; the judge's side is in tests/operations/test_judge.py, the form's in
tests/web/test_param_forms.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from controlplane.models import CanarySplit
from controlplane.services import canaries
from controlplane.services.guardrails import Guardrails, validate_guardrails

from .endpoints import canary_body, fill
from .helpers import assert_refused, session_client

SETUP = "import django; django.setup()"


def post(client, path: str, body: Any):
    return client.post(path, body, content_type="application/json")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("guardrails", "field", "words"),
    [
        ({"min_samples": 0}, "guardrails.min_samples", ("whole number ≥ 1", "(got 0)")),
        ({"min_samples": 2.5}, "guardrails.min_samples", ("whole number", "(got 2.5)")),
        ({"max_failures": True}, "guardrails.max_failures", ("whole number", "(got True)")),
        ({"p_value": "0.01"}, "guardrails.p_value", ("finite number", "(got '0.01')")),
        ({"step_seconds": 90_000}, "guardrails.step_seconds", ("at most 86400",)),
    ],
)
def test_the_api_refuses_a_bad_guardrail_naming_it(world, users, guardrails, field, words):
    body = {**fill(canary_body(), world.ids), "guardrails": guardrails}
    count = CanarySplit.objects.count()
    response = post(
        session_client(users["operator"]), f"/api/v1/clusters/{world['alpha']}/canaries", body
    )
    assert_refused(response, 400, field, *words)
    assert CanarySplit.objects.count() == count


@pytest.mark.django_db
def test_the_api_names_every_bad_guardrail_and_stores_whole_numbers(world, users):
    operator = session_client(users["operator"])
    path = f"/api/v1/clusters/{world['alpha']}/canaries"
    body = fill(canary_body(), world.ids)
    bad = {**body, "guardrails": {"min_samples": 0, "p_value": -1, "speed": 1}}
    problems = post(operator, path, bad).json()["error"]["problems"]
    assert [p["field"] for p in problems] == [
        "guardrails.min_samples",
        "guardrails.p_value",
        "guardrails.speed",
    ]
    response = post(operator, path, {**body, "guardrails": {"min_samples": 30.0}})
    assert response.status_code == 201, response.content
    stored = CanarySplit.objects.get(pk=response.json()["id"]).guardrails
    assert stored == {**Guardrails().model_dump(), "min_samples": 30}
    assert isinstance(stored["min_samples"], int)


@pytest.mark.django_db
def test_canary_defaults_list_each_guardrail_from_the_model(users):
    body = session_client(users["viewer"]).get("/api/v1/canary-defaults").json()
    assert list(body["guardrails"]) == list(Guardrails.model_fields)
    assert body["guardrails"]["min_samples"] == {
        "default": 50,
        "minimum": 1.0,
        "limit": 100_000.0,
        "whole": True,
        "help": Guardrails.model_fields["min_samples"].description,
    }


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ('{"min_samples": 0}', "guardrails.min_samples"),
        ('{"p_value": "lots"}', "guardrails.p_value"),
        ('{"step_seconds": 900}', "guardrails.max_wait_seconds"),  # past the default wait
    ],
)
def test_bad_site_defaults_name_the_variable_and_the_field(settings, given, field) -> None:
    settings.SWITCHYARD_CANARY_DEFAULTS = given
    canaries.site_defaults.cache_clear()
    try:
        with pytest.raises(ImproperlyConfigured) as refused:
            canaries.site_defaults()
    finally:
        canaries.site_defaults.cache_clear()
    assert str(refused.value).startswith(f"SWITCHYARD_CANARY_DEFAULTS: {field}: ")


def test_a_bad_site_default_stops_start_up() -> None:
    started = subprocess.run(
        [sys.executable, "-c", SETUP],
        capture_output=True,
        text=True,
        env={**os.environ, "SWITCHYARD_CANARY_DEFAULTS": '{"min_samples": 0}'},
    )
    assert started.returncode != 0
    assert (
        "SWITCHYARD_CANARY_DEFAULTS: guardrails.min_samples: must be a whole number ≥ 1 (got 0)"
        in started.stderr
    )


def test_good_site_defaults_are_the_base_of_a_canarys_guardrails(settings) -> None:
    settings.SWITCHYARD_CANARY_DEFAULTS = '{"min_samples": 30, "weight_steps": [25, 50]}'
    canaries.site_defaults.cache_clear()
    try:
        defaults = canaries.site_defaults()
    finally:
        canaries.site_defaults.cache_clear()
    assert defaults.weight_steps == [25, 50]
    assert validate_guardrails({"p_value": 0.01}, defaults.guardrails) == Guardrails(
        min_samples=30, p_value=0.01
    )


def test_stored_guardrails_read_defaults_for_missing_ones_and_refuse_no_number() -> None:
    # an older release stored neither max_wait_seconds nor a bounded step_seconds
    stored = Guardrails.of_stored({"min_samples": 20.0, "step_seconds": 1e14})
    assert (stored.min_samples, stored.step_seconds, stored.max_wait_seconds) == (20, 1e14, 600)
    with pytest.raises(ValueError, match=r"guardrails\.min_samples"):
        Guardrails.of_stored({"min_samples": "lots"})


@pytest.mark.parametrize(
    ("given", "shown"),
    [
        ({"min_samples": 10**5000}, "(got a number too long to show)"),  # past str()'s limit
        ({"p_value": "x" * 100_000}, "(got 'xxxx"),
        ({"max_wait_seconds": 5}, "must be at least step_seconds (60)"),
    ],
)
def test_any_value_gets_a_short_message_naming_its_field(given, shown) -> None:
    from controlplane.services.errors import ServiceError

    with pytest.raises(ServiceError) as refused:
        validate_guardrails(given, Guardrails())
    (name,) = given
    assert refused.value.field == f"guardrails.{name}"
    assert shown in refused.value.message and len(refused.value.message) < 200
