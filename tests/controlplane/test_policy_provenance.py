"""Parameters an operator can trust: every policy parameter says where its default comes
from (derived from the cluster, chosen on the evaluation matrix, the paper's, ours, or
operational) in the policy form and the API; and where a policy kind breaks the
never-collapse invariant in the robustness suite is shown where a policy is chosen (policy
form, replay form, API) — or that no run is recorded, never a failed page."""

from __future__ import annotations

import json
import logging
from html import unescape
from pathlib import Path
from typing import Any

import pytest
from django.urls import reverse
from pydantic import BaseModel, Field

from controlplane.selectors import robustness
from controlplane.selectors.robustness import NO_RUN, UNREADABLE
from controlplane.services.validation import policy_kinds
from controlplane.web.schema_form import param_fields
from enginesim.replay.policy_costs import COST_MODEL_FIELDS
from router_worker.routing import REGISTRY
from router_worker.routing.provenance import KINDS, MATRIX_FLEET, matrix, params_provenance
from tests.web.helpers import Element, described, parse

pytestmark = pytest.mark.django_db

CELL = "long_output@l40s+qwen2.5-7b/high"
BREACHES = ["throughput 0.94× round robin's", "mean TPOT 2.31× least load's"]
BREAK: dict[str, Any] = {"cell": CELL, "breaches": BREACHES}
SUMMARY: dict[str, Any] = {
    "source": "bench/robustness/run.py (report: bench/robustness/README.md)",
    "generated": "2026-12-04",
    "seeds": 3,
    "invariant": "output throughput ≥ 0.95 × round robin's, mean TTFT and mean TPOT "
    "≤ 2 × least load's (seed means)",
    "policies": {
        "lmetric": {"cells": 36, "breaks": [BREAK]},
        "smetric": {"cells": 36, "breaks": []},
    },
}


# -- provenance: one per parameter, from the policy classes ------------------------------


@pytest.mark.parametrize("kind", sorted(REGISTRY))
def test_every_parameter_of_every_policy_has_a_provenance(kind: str) -> None:
    table = params_provenance(REGISTRY[kind].Params)
    missing = [name for name, found in table.items() if found is None]
    assert not missing, (
        f"{kind}: no provenance on {missing} (see router_worker/routing/provenance.py)"
    )
    # the form reads the JSON schema: the same parameters, each with the same provenance
    fields = param_fields(REGISTRY[kind].Params.model_json_schema())
    assert {f.name: f.provenance for f in fields} == table


@pytest.mark.parametrize("kind", sorted(REGISTRY))
def test_derived_parameters_are_exactly_those_the_control_plane_derives(kind: str) -> None:
    table = params_provenance(REGISTRY[kind].Params)
    derived = {name for name, found in table.items() if found and found.provenance == "derived"}
    assert derived == set(COST_MODEL_FIELDS.get(kind, ()))


def test_matrix_defaults_name_their_fleet_and_paper_ones_their_source() -> None:
    for kind, cls in REGISTRY.items():
        for name, found in params_provenance(cls.Params).items():
            assert found is not None and found.provenance in KINDS
            if found.provenance == "matrix":
                assert found.measured_on == MATRIX_FLEET, (kind, name)
            if found.provenance == "paper":
                assert found.source, (kind, name)


def test_a_parameter_without_provenance_is_reported() -> None:
    class Nested(BaseModel):
        kept: int = Field(1, json_schema_extra=matrix())
        forgotten: int = 2

    class Params(BaseModel):
        inner: Nested = Field(default_factory=Nested)
        plain: float = 0.5

    table = params_provenance(Params)
    assert table["inner.kept"] is not None and table["inner.kept"].provenance == "matrix"
    assert table["inner.forgotten"] is None and table["plain"] is None


def test_the_classification_of_the_documented_defaults() -> None:
    def kind_of(kind: str, name: str) -> str:
        found = params_provenance(REGISTRY[kind].Params)[name]
        assert found is not None
        return found.provenance

    assert kind_of("lmetric", "batch_offset") == "matrix"
    assert kind_of("lmetric", "decode_slack") == "design"  # checked, not swept on the matrix
    assert kind_of("lmetric", "prefill_term") == kind_of("lmetric", "load_term") == "paper"
    assert kind_of("lmetric", "hotspot.max_hit_fraction") == "matrix"
    assert kind_of("smetric", "slo_ttft_s") == "matrix"
    assert kind_of("smetric", "session_table_size") == "operational"
    assert kind_of("dualmap", "slo_ttft_s") == "matrix"
    assert kind_of("preble", "window_s") == kind_of("preble", "th_bal") == "paper"
    assert kind_of("predicted_ttft", "prefill_tps") == "derived"


# -- the API ------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def summary_file(settings, tmp_path: Path):
    """Point the selector at a file of the test's own (absent until written: whatever the
    suite records in controlplane/data/ never reaches these tests); returns a writer."""
    path = tmp_path / "robustness.json"
    settings.SWITCHYARD_ROBUSTNESS_SUMMARY = str(path)

    def write(content: Any) -> Path:
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content if isinstance(content, str) else json.dumps(content))
        return path

    return write


def kinds_api(as_role) -> dict[str, dict]:
    response = as_role("viewer").get("/api/v1/policy-kinds")
    assert response.status_code == 200, response.content
    return {k["kind"]: k for k in response.json()}


def test_api_lists_each_parameters_provenance(world, as_role, summary_file) -> None:
    summary_file(SUMMARY)
    kinds = kinds_api(as_role)
    for kind, cls in REGISTRY.items():
        table = params_provenance(cls.Params)
        assert set(kinds[kind]["params_provenance"]) == set(table), kind
    offset = kinds["lmetric"]["params_provenance"]["batch_offset"]
    assert offset == {
        "provenance": "matrix",
        "label": "chosen on the evaluation matrix (16 × H20, Qwen2-7B)",
        "measured_on": MATRIX_FLEET,
        "source": None,
    }
    assert kinds["lmetric"]["params_provenance"]["hotspot.window_s"]["provenance"] == "design"
    assert kinds["preble"]["params_provenance"]["window_s"]["source"] == "Preble"
    # the schema itself carries it too, for clients that read only params_schema
    prop = kinds["lmetric"]["params_schema"]["properties"]["decode_fixed_tokens"]
    assert prop["provenance"] == "derived"


def test_api_gives_each_kind_its_robustness_record(world, as_role, summary_file) -> None:
    summary_file(SUMMARY)
    kinds = kinds_api(as_role)
    lmetric = kinds["lmetric"]["robustness"]
    assert lmetric["status"] == "breaks" and lmetric["cells"] == 36
    assert lmetric["breaks"] == [BREAK]
    assert lmetric["generated"] == "2026-12-04"
    assert lmetric["headline"] == (
        "Breaks the invariant in 1 of 36 cells of the robustness suite (2026-12-04)"
    )
    assert kinds["smetric"]["robustness"]["status"] == "keeps"
    assert kinds["round_robin"]["robustness"]["status"] == "not_judged"
    assert "reference" in kinds["round_robin"]["robustness"]["headline"]


def test_api_without_a_run_says_so(world, as_role, summary_file) -> None:
    for record in kinds_api(as_role).values():
        assert record["robustness"] == {
            "status": "unavailable",
            "headline": NO_RUN,
            "cells": None,
            "breaks": [],
            "generated": None,
            "invariant": "",
        }


def test_openapi_documents_provenance_and_robustness(world, as_role) -> None:
    schema = as_role("viewer").get("/api/v1/openapi.json").json()["components"]["schemas"]
    kind_out = schema["PolicyKindOut"]["properties"]
    assert {"params_provenance", "robustness"} <= set(kind_out)
    enum = schema["ParamProvenanceOut"]["properties"]["provenance"]["enum"]
    assert set(enum) == set(KINDS)


# -- the robustness selector ---------------------------------------------------------------


def test_selector_reads_a_recorded_run(summary_file) -> None:
    summary_file(SUMMARY)
    summary = robustness.robustness()
    assert summary.available and summary.seeds == 3
    smetric = summary.of("smetric")
    assert smetric.status == "keeps" and not smetric.breaks
    assert smetric.headline == (
        "Keeps the invariant in all 36 cells of the robustness suite (2026-12-04)"
    )
    lmetric = summary.of("lmetric")
    assert lmetric.status == "breaks"
    assert [(b.cell, b.breaches) for b in lmetric.breaks] == [(CELL, tuple(BREACHES))]
    assert summary.of("dualmap").status == "not_judged"


def test_selector_without_a_file_records_no_run(summary_file) -> None:
    summary = robustness.robustness()  # the fixture set the path, wrote nothing
    assert not summary.available and summary.note == NO_RUN
    assert robustness.by_kind(["lmetric"])["lmetric"].headline == NO_RUN


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        "[1, 2]",
        json.dumps({**SUMMARY, "generated": "yesterday"}),
        json.dumps({**SUMMARY, "policies": {"lmetric": {"cells": 1, "breaks": [BREAK, BREAK]}}}),
        json.dumps({k: v for k, v in SUMMARY.items() if k != "policies"}),
        b"\xff\xfe{}",
    ],
    ids=[
        "truncated",
        "not-an-object",
        "bad-date",
        "more-breaks-than-cells",
        "no-policies",
        "bytes",
    ],
)
def test_selector_logs_a_malformed_file_and_shows_it_unavailable(
    summary_file, caplog, content: str | bytes
) -> None:
    summary_file(content)
    with caplog.at_level(logging.ERROR, logger="controlplane.selectors.robustness"):
        summary = robustness.robustness()
    assert not summary.available and summary.note == UNREADABLE
    assert summary.of("lmetric").status == "unavailable"
    assert any("robustness summary" in r.getMessage() for r in caplog.records)


# -- the pages -------------------------------------------------------------------------------


def robustness_of(root: Element, kind: str) -> Element:
    return root.find(data_testid="robustness", data_kind=kind)


def test_policy_form_shows_each_parameters_provenance(world, as_role) -> None:
    url = reverse("web:policy_params", args=[world["alpha"]])
    for kind in ("lmetric", "predicted_ttft", "preble"):
        root = parse(as_role("operator").get(url, {"kind": kind}))
        fields = param_fields(policy_kinds()[kind]["schema"])
        badges = root.find_all(data_testid="param-provenance")
        assert len(badges) == len(fields)
        for field in fields:
            assert field.provenance is not None
            text = described(root, root.find(name=field.input_name))
            assert f"Origin of the default: {field.provenance.text}." in text, (kind, field.name)
    root = parse(as_role("operator").get(url, {"kind": "lmetric"}))
    offset = described(root, root.find(name="param.batch_offset"))
    assert "Origin of the default: chosen on the evaluation matrix (16 × H20, Qwen2-7B)" in offset
    # between what the knob does and its value: the description still leads, the value ends
    assert offset.startswith("c in the load term")
    assert offset.endswith("default 1.0; ≥ 0; blank: the default")
    derived = described(root, root.find(name="param.decode_fixed_tokens"))
    assert "Origin of the default: derived from this cluster's GPU and model" in derived


def test_policy_page_shows_breaks_for_the_chosen_kind(world, as_role, summary_file) -> None:
    summary_file(SUMMARY)
    page = as_role("operator").get(reverse("web:policy", args=[world["alpha"]]))
    assert page.status_code == 200
    root = parse(page)
    # the new-policy form opens on the active kind (lmetric), breaks listed
    form = root.find(id="param-fields")
    shown = form.find(data_testid="robustness", data_kind="lmetric")
    assert shown.attrs["data-status"] == "breaks"
    text = " ".join(shown.text.split())
    assert "Breaks the invariant in 1 of 36 cells of the robustness suite (2026-12-04)" in text
    assert f"{CELL}: {'; '.join(BREACHES)}" in text
    # swapping the kind (htmx) brings that kind's record
    partial = parse(
        as_role("operator").get(
            reverse("web:policy_params", args=[world["alpha"]]), {"kind": "smetric"}
        )
    )
    kept = " ".join(robustness_of(partial, "smetric").text.split())
    assert "Keeps the invariant in all 36 cells of the robustness suite (2026-12-04)" in kept


@pytest.mark.parametrize("content", [None, "{not json"], ids=["missing", "malformed"])
def test_pages_without_a_readable_run_still_render(
    world, as_role, summary_file, content: str | None
) -> None:
    if content is not None:
        summary_file(content)
    expected = NO_RUN if content is None else UNREADABLE
    for name in ("web:policy", "web:replays"):
        page = as_role("operator").get(reverse(name, args=[world["alpha"]]))
        assert page.status_code == 200, name
        assert expected in unescape(page.content.decode())
    partial = as_role("operator").get(
        reverse("web:policy_params", args=[world["alpha"]]), {"kind": "lmetric"}
    )
    assert expected in unescape(partial.content.decode())


def test_replay_form_describes_each_policy_with_its_robustness(
    world, as_role, summary_file
) -> None:
    summary_file(SUMMARY)
    root = parse(as_role("operator").get(reverse("web:replays", args=[world["alpha"]])))
    box = root.find("input", name="policies", value=str(world["lm"]))
    text = described(root, box)
    assert "Breaks the invariant in 1 of 36 cells" in text and CELL in text
    rr = described(root, root.find("input", name="policies", value=str(world["rr"])))
    assert "reference" in rr
