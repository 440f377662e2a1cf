"""A canary's guardrails: one typed model for the form, the API, the judge and the
deployment's defaults (``SWITCHYARD_CANARY_DEFAULTS``).

Each field carries its built-in default, its bounds (the largest value is where a typo
begins; some, like a step of 1e14 s, overflow the judge's date arithmetic) and its help
text, which the form and ``GET /canary-defaults`` show. Every entry point validates with
the same model, field by field, and refuses with a message naming each field at fault
(``guardrails.<name>: ...``); the form parses its text boxes with :func:`from_form` first.

A new guardrail is one field here (and its use in ``services/judge.py``); canaries stored
without it read its default (:meth:`Guardrails.of_stored`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticCustomError

from .errors import Invalid

PREFIX = "guardrails"
# What the form accepts as a number: decimal, optionally signed, with an optional exponent
# ("2e" or "1.2.3" is refused, never read as something else).
NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


class Guardrails(BaseModel):
    """The judge's limits for one canary; every field has a default."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    max_error_rate: float = Field(
        0.02,
        ge=0,
        le=1,
        description="hard guard: highest share of the candidate's requests that may fail "
        "per step before rollback",
    )
    max_hotspot_fallback_rate: float = Field(
        0.5,
        ge=0,
        le=1,
        description="hard guard: highest share of the candidate's decisions that may be "
        "hotspot fallbacks per step",
    )
    max_ttft_p95_ratio: float = Field(
        3.0,
        ge=1,
        le=1_000,
        description="hard guard: highest ratio of the candidate's p95 TTFT to the baseline's "
        "per step (catches a tail that the median test cannot see)",
    )
    min_samples: int = Field(
        50,
        ge=1,
        le=100_000,
        description="requests needed per arm and step before judging; fewer halts the step "
        "(no data is never a pass)",
    )
    p_value: float = Field(
        0.05, ge=0, le=1, description="significance level of the Mann-Whitney test between the arms"
    )
    effect_tolerance: float = Field(
        0.10,
        ge=0,
        le=100,
        description="accepted relative worsening of the candidate's median TTFT/TPOT (0.10 = 10%)",
    )
    max_failures: int = Field(
        2, ge=0, le=1_000, description="failed steps tolerated before automatic rollback"
    )
    step_seconds: float = Field(
        60,
        ge=0,
        le=86_400,
        description="minimum time at a weight step before it is judged, seconds",
    )
    max_wait_seconds: float = Field(
        600,
        ge=0,
        le=7 * 86_400,
        description="longest a step may wait for min_samples, seconds from its start: "
        "while the arms' measured sample rates say min_samples arrives within it the judge "
        "waits; past it the canary pauses for the operator",
    )

    @field_validator("*", mode="before")
    @classmethod
    def _a_number(cls, value: Any) -> Any:
        # JSON true is no number, and text is the form's to parse (from_form), not the model's.
        if isinstance(value, bool | str) or not isinstance(value, int | float):
            raise PydanticCustomError("not_a_number", "must be a number")
        return value

    @field_validator("max_wait_seconds")
    @classmethod
    def _wait_covers_a_step(cls, value: float, info: ValidationInfo) -> float:
        step = info.data.get("step_seconds")
        if step is not None and value < step:
            raise PydanticCustomError(
                "wait_before_step",
                "must be at least step_seconds ({step}): a step is never judged before "
                "step_seconds",
                {"step": f"{step:g}"},
            )
        return value

    @classmethod
    def of_stored(cls, stored: Any) -> Guardrails:
        """A canary's stored guardrails, read by the judge and the canary pages.

        The built-in default for each one the canary was stored without (it came later).
        Values stored outside today's bounds (by an older release or a hand edit) are kept
        as they are, except ``min_samples``, read as at least 1: no data is never a pass.
        A value that is no number raises ValueError naming it."""
        given = stored if isinstance(stored, dict) else {}
        values = cls().model_dump()
        for name in values:
            value = given.get(name, values[name])
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{PREFIX}.{name}: stored value {_shown(value)} is not a number")
            values[name] = value
        values["min_samples"] = max(values["min_samples"], 1)
        return cls.model_construct(**values)


def rules(name: str) -> dict[str, Any]:
    """What the guardrail ``name`` accepts, for the form and ``GET /canary-defaults``: its
    smallest and largest value, whether it is a whole number, and its help text."""
    field = Guardrails.model_fields[name]
    bounds = {
        key: float(getattr(rule, key))
        for rule in field.metadata
        for key in ("ge", "le")
        if getattr(rule, key, None) is not None
    }
    return {
        "minimum": bounds["ge"],
        "limit": bounds["le"],
        "whole": field.annotation is int,
        "help": field.description or "",
    }


def validate_guardrails(given: Mapping[str, Any] | None, base: Guardrails) -> Guardrails:
    """``base`` with the guardrails in ``given`` changed, validated field by field.

    Raises Invalid listing every field at fault (``guardrails.<name>``), each with the
    value it was given."""
    given = dict(given or {})
    try:
        return Guardrails.model_validate({**base.model_dump(), **given})
    except ValidationError as error:
        raise Invalid([_problem(e, given) for e in error.errors()]) from None


def _problem(error: Any, given: dict[str, Any]) -> dict[str, str]:
    name = str(error["loc"][0])
    field = f"{PREFIX}.{name}"
    if error["type"] == "extra_forbidden":
        known = sorted(Guardrails.model_fields)
        return {"field": field, "message": f"{field}: unknown guardrail; known: {known}"}
    whole = Guardrails.model_fields[name].annotation is int
    kind = "a whole number" if whole else "a finite number"
    ctx = error.get("ctx") or {}
    if error["type"] == "greater_than_equal":
        text = f"must be {kind} ≥ {ctx['ge']:g}"
    elif error["type"] == "less_than_equal":
        text = f"must be at most {ctx['le']:g}"
    elif error["type"] == "wait_before_step":
        text = error["msg"]
    else:  # no number, not finite, not whole
        text = f"must be {kind}"
    value = given.get(name, error.get("input"))  # a default's own value when not given
    return {"field": field, "message": f"{field}: {text} (got {_shown(value)})"}


def _shown(value: Any) -> str:
    try:
        return repr(value)[:80]
    except ValueError:  # an int past Python's 4300-digit str limit
        return "a number too long to show"


def from_form(texts: Mapping[str, str]) -> dict[str, float | int]:
    """The guardrails an operator typed into the form (``name: text``), as numbers; a blank
    box means the deployment's default and is left out. Text that is no decimal number
    ("2e", "1.2.3") is refused naming its field, never read as another value."""
    values: dict[str, float | int] = {}
    problems = []
    for name, text in texts.items():
        text = text.strip()
        if not text:
            continue
        if NUMBER.fullmatch(text):  # whole numbers stay whole: "(got 0)", not "(got 0.0)"
            whole = text.lstrip("+-").isdigit() and len(text) < 20
            values[name] = int(text) if whole else float(text)
        else:
            field = f"{PREFIX}.{name}"
            problems.append({"field": field, "message": f"{field}: {text[:40]!r} is not a number"})
    if problems:
        raise Invalid(problems)
    return values
