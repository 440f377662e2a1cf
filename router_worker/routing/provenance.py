"""Where each policy parameter's default comes from, and which fleet it was measured on.

A default is only as trustworthy as the fleet it was chosen on. Every field of every
policy's ``Params`` (nested ones included) carries its provenance in its JSON schema
(``json_schema_extra=matrix()`` and so on), so the operator form and the API read it from
the one class that also validates the value. The kinds:

* ``derived``: filled per cluster from its GPU and model by the control plane
  (``enginesim/replay/policy_costs.py``'s ``COST_MODEL_FIELDS``); blank means "derive it";
* ``matrix``: chosen on the evaluation matrix (``bench/replay/run.py`` and its sweeps),
  measured on :data:`MATRIX_FLEET`; docs/algorithms.md names the runs;
* ``paper``: the published algorithm's value or form (``source`` names it);
* ``design``: Switchyard's own choice, argued in docs/algorithms.md or the policy's
  docstring but not tuned on a fleet (``measured_on`` names the hardware a value was
  computed for, where it was);
* ``operational``: a bound or a size with no routing effect.

Only metadata: nothing here changes a value, a bound or a decision.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo

ProvenanceKind = Literal["derived", "matrix", "paper", "design", "operational"]
KINDS: tuple[ProvenanceKind, ...] = ("derived", "matrix", "paper", "design", "operational")
MATRIX_FLEET = "16 × H20, Qwen2-7B"

# What an operator reads next to the value.
LABELS: dict[str, str] = {
    "derived": "derived from this cluster's GPU and model",
    "matrix": "chosen on the evaluation matrix",
    "paper": "the published algorithm's",
    "design": "Switchyard's own choice, not tuned",
    "operational": "operational: a bound or size, no routing effect",
}


def derived() -> dict[str, Any]:
    return {"provenance": "derived"}


def matrix() -> dict[str, Any]:
    return {"provenance": "matrix", "measured_on": MATRIX_FLEET}


def paper(source: str) -> dict[str, Any]:
    return {"provenance": "paper", "source": source}


def design(on: str | None = None) -> dict[str, Any]:
    return {"provenance": "design"} | ({"measured_on": on} if on else {})


def operational() -> dict[str, Any]:
    return {"provenance": "operational"}


@dataclass(frozen=True, slots=True)
class ParamProvenance:
    """One parameter's provenance, as its field declares it."""

    provenance: str
    measured_on: str | None = None
    source: str | None = None

    @classmethod
    def from_schema(cls, node: dict[str, Any]) -> ParamProvenance | None:
        """From a JSON-schema property (or a field's ``json_schema_extra``); None if absent
        or not one of :data:`KINDS`."""
        kind = node.get("provenance")
        if kind not in KINDS:
            return None
        return cls(kind, node.get("measured_on"), node.get("source"))

    @property
    def text(self) -> str:
        """ "chosen on the evaluation matrix (16 × H20, Qwen2-7B)", "the published
        algorithm's (Preble)", ..."""
        detail = ", ".join(part for part in (self.source, self.measured_on) if part)
        label = LABELS[self.provenance]
        return f"{label} ({detail})" if detail else label

    def to_dict(self) -> dict[str, Any]:
        return {
            "provenance": self.provenance,
            "label": self.text,
            "measured_on": self.measured_on,
            "source": self.source,
        }


def field_provenance(field: FieldInfo) -> ParamProvenance | None:
    extra = field.json_schema_extra
    return ParamProvenance.from_schema(extra) if isinstance(extra, dict) else None


def params_provenance(
    params: type[BaseModel], prefix: str = ""
) -> dict[str, ParamProvenance | None]:
    """Every leaf parameter of ``params`` (nested models by dotted path, ``hotspot.window_s``,
    as the operator form names them) → its provenance, None where a field declares none."""
    table: dict[str, ParamProvenance | None] = {}
    for name, field in params.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            table |= params_provenance(annotation, f"{prefix}{name}.")
        else:
            table[f"{prefix}{name}"] = field_provenance(field)
    return table
