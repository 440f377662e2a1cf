"""Property-based fuzzing of every operation in the OpenAPI schema: no input, valid or
not, may make the API answer with a 5xx. Runs in-process (WSGI), authenticated as admin
with an API token, with a bounded number of examples per operation."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from controlplane.services.tokens import create_api_token

from .helpers import SYSTEM

MAX_EXAMPLES = 10


class InTransactionWSGI:
    """Django's WSGI handler, minus the end-of-request connection clean-up that would
    close the test's transaction (the same thing Django's test client does)."""

    def __init__(self) -> None:
        self.handler = get_wsgi_application()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        for signal in (request_started, request_finished):
            signal.disconnect(close_old_connections)
        try:
            response = self.handler(environ, start_response)
            body = list(response)
            response.close()
            return body
        finally:
            for signal in (request_started, request_finished):
                signal.connect(close_old_connections)


# Coverage phase (boundary and invalid values of every parameter) plus fuzzing; of the
# "wrong method" probes only PATCH, since every method is routed the same way.
CONFIG = schemathesis.Config.from_dict(
    {
        "phases": {"coverage": {"unexpected-methods": ["patch"]}, "stateful": {"enabled": False}},
    }
)
schema = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", InTransactionWSGI(), config=CONFIG)


@pytest.fixture
def admin_token(world, users) -> str:
    plaintext, _ = create_api_token(SYSTEM, users["admin"], "schemathesis")
    return plaintext


@pytest.mark.single_process
@pytest.mark.django_db
@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_input_makes_the_api_fail_with_a_5xx(case, admin_token, replay_dispatches) -> None:
    case.call_and_validate(
        headers={"Authorization": f"Bearer {admin_token}"}, checks=[not_a_server_error]
    )
