"""A typo never goes live: every form posts its numbers as text, and one
strict reader (controlplane/services/numbers.py) refuses what is not a number, naming the
field, before anything is stored or activated. A blank field means the default, and every
form says so next to it; a guard is turned off (null) only by typing ``none``. The replay
form caps max_requests as the API does."""

from __future__ import annotations

import pytest
from django.urls import reverse

from controlplane.models import ConfigVersion, Policy, ReplayJob
from controlplane.services import numbers
from controlplane.services.errors import ServiceError

from .helpers import TRACE, described, parse, policy_ids

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "text", ["2e", "1.2.3", "1_0", "0x10", "inf", "nan", "1e999", " ", "٣", "1" * 41, "--1"]
)
def test_the_reader_refuses_what_is_not_a_decimal_number_naming_the_field(text) -> None:
    with pytest.raises(ServiceError) as refused:
        numbers.number(text, "decode_slack")
    assert refused.value.field == "decode_slack"
    assert refused.value.message.startswith("decode_slack")


@pytest.mark.parametrize(
    ("text", "value"), [("2", 2), ("-1", -1), (" 1.5 ", 1.5), (".5", 0.5), ("2e3", 2000.0)]
)
def test_the_reader_reads_decimal_numbers(text, value) -> None:
    read = numbers.number(text, "x")
    assert read == value and type(read) is type(value)


@pytest.mark.parametrize("text", ["1e300", "2.0", "1" * 19, "9" * 5000, "", "+", "1 2"])
def test_whole_numbers_are_digits_only_and_short(text) -> None:
    with pytest.raises(ServiceError, match="is not a whole number"):
        numbers.whole_number(text, "max_requests")


def _new_policy(as_role, cluster, name: str, **params: str):
    data = {
        "policy": "new",
        "name": name,
        "kind": "lmetric",
        "reason": "tighten the decode guard",
        "confirm": "yes",
        "param.prefill_term": "miss_ratio",
        "param.hotspot.enabled": "on",
        **params,
    }
    return as_role("operator").post(reverse("web:policy_apply", args=[cluster.pk]), data)


@pytest.mark.parametrize("typo", ["2e", "1.2.3", "1,5", "two"])
def test_a_typo_in_the_policy_form_is_refused_naming_its_field(as_role, cluster, typo) -> None:
    versions = ConfigVersion.objects.filter(cluster=cluster).count()
    response = _new_policy(as_role, cluster, "typo", **{"param.decode_slack": typo})
    assert response.status_code == 400
    root = parse(response)
    slack = root.find("input", name="param.decode_slack")
    assert slack.attrs["value"] == typo and slack.attrs["aria-invalid"] == "true"
    assert f"lmetric.decode_slack: must be a number (got '{typo}')" in described(root, slack)
    assert not Policy.objects.filter(cluster=cluster, name="typo").exists()
    assert ConfigVersion.objects.filter(cluster=cluster).count() == versions
    cluster.refresh_from_db()
    assert cluster.active_policy is not None and cluster.active_policy.name == "lm"


def test_a_typo_and_an_out_of_bounds_value_are_named_together(as_role, cluster) -> None:
    response = _new_policy(
        as_role, cluster, "two", **{"param.decode_slack": "2e", "param.batch_offset": "-1"}
    )
    assert response.status_code == 400
    root = parse(response)
    assert "must be a number (got '2e')" in described(
        root, root.find("input", name="param.decode_slack")
    )
    assert "lmetric.batch_offset: must be ≥ 0 (got -1)" in described(
        root, root.find("input", name="param.batch_offset")
    )


def test_blank_means_the_default_and_none_means_null(as_role, cluster) -> None:
    assert _new_policy(as_role, cluster, "blank", **{"param.decode_slack": ""}).status_code == 302
    assert Policy.objects.get(cluster=cluster, name="blank").params["decode_slack"] == 2.0
    assert _new_policy(as_role, cluster, "off", **{"param.decode_slack": "none"}).status_code == 302
    assert Policy.objects.get(cluster=cluster, name="off").params["decode_slack"] is None


def test_number_inputs_are_text_and_say_what_blank_means(as_role, cluster) -> None:
    root = parse(
        as_role("operator").get(
            reverse("web:policy_params", args=[cluster.pk]), {"kind": "lmetric"}
        )
    )
    slack = root.find("input", name="param.decode_slack")
    assert slack.attrs["type"] == "text" and slack.attrs["inputmode"] == "decimal"
    assert "blank: the default; none: null" in described(root, slack)
    for page in ("web:replays", "web:captures", "web:canary"):
        html = as_role("operator").get(reverse(page, args=[cluster.pk])).content.decode()
        assert 'type="number"' not in html, page
    assert 'type="number"' not in as_role("operator").get(reverse("web:tokens")).content.decode()


@pytest.mark.parametrize("value", ["1e300", "10000001", "9" * 5000])
def test_the_replay_form_caps_max_requests_as_the_api_does(
    as_role, cluster, traces, dispatched, value
) -> None:
    form = {"trace": TRACE, "policies": policy_ids(cluster), "max_requests": value}
    response = as_role("operator").post(reverse("web:replay_create", args=[cluster.pk]), form)
    assert response.status_code == 400
    assert "max_requests" in response.content.decode()
    assert not ReplayJob.objects.filter(cluster=cluster).exists()


HUGE = "9" * 5000  # past Python's 4,300-digit limit on int(): a ValueError, a 500 before


def test_huge_ids_in_query_strings_and_forms_are_a_400_not_a_500(as_role, cluster) -> None:
    viewer, operator = as_role("viewer"), as_role("operator")
    canary = reverse("web:canary", args=[cluster.pk])
    for value in (HUGE, "9" * 19):
        assert viewer.get(canary, {"from_replay": value}).status_code == 400
    assert viewer.get(canary, {"from_replay": "12345"}).status_code == 404  # not a replay
    for page in ("web:hotspots", "web:audit"):
        assert viewer.get(reverse(page), {"cluster": HUGE}).status_code == 400
    replay = operator.post(
        reverse("web:replay_create", args=[cluster.pk]), {"trace": "x", "policies": HUGE}
    )
    assert replay.status_code == 400
    created = operator.post(
        reverse("web:canary_create", args=[cluster.pk]),
        {"name": "c", "baseline_policy": HUGE, "source_replay": HUGE},
    )
    assert created.status_code == 400
