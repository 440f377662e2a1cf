"""Operator-facing messages for invalid policy parameters.

pydantic's own texts ("Input should be greater than or equal to 0") neither name the field
nor show the value; these do: ``lmetric.batch_offset: must be ≥ 0 (got -1)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

# pydantic error type -> phrase; {name} placeholders come from the error's ctx.
PHRASES: dict[str, str] = {
    "greater_than_equal": "must be ≥ {ge}",
    "greater_than": "must be > {gt}",
    "less_than_equal": "must be ≤ {le}",
    "less_than": "must be < {lt}",
    "finite_number": "must be a finite number",
    "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number",
    "int_type": "must be a whole number",
    "float_parsing": "must be a number",
    "float_type": "must be a number",
    "bool_parsing": "must be true or false",
    "bool_type": "must be true or false",
    "literal_error": "must be one of {expected}",
    "enum": "must be one of {expected}",
    "missing": "is required",
    "model_type": "must be an object of parameters",
    "model_attributes_type": "must be an object of parameters",
}


@dataclass(frozen=True)
class ParamProblem:
    """One invalid parameter: its dotted path inside the params and the message."""

    path: str  # "" when the params object itself is at fault
    message: str  # "<kind>.<path>: <what is wrong> (got <value>)"


def param_problems(
    kind: str, params_class: type[BaseModel], error: ValidationError
) -> list[ParamProblem]:
    """Every problem of ``error`` (raised validating ``params_class``), field named."""
    problems = []
    for item in error.errors():
        path = ".".join(str(part) for part in item["loc"])
        problems.append(
            ParamProblem(path, f"{kind}.{path or 'params'}: {_phrase(item, params_class, path)}")
        )
    return problems


def _phrase(item: ErrorDetails, params_class: type[BaseModel], path: str) -> str:
    if item["type"] == "extra_forbidden":
        known = ", ".join(_known_fields(params_class, path)) or "none"
        return f"unknown parameter (known: {known})"
    template = PHRASES.get(item["type"])
    try:
        ctx = {key: _number(value) for key, value in item.get("ctx", {}).items()}
        text = template.format(**ctx) if template else item["msg"]
    except (KeyError, IndexError):
        text = item["msg"]
    if item["type"] != "missing" and "input" in item:
        text += f" (got {_shown(item['input'])})"
    return text


def _known_fields(params_class: type[BaseModel], path: str) -> list[str]:
    """The parameter names allowed next to the unknown one at ``path``."""
    model: Any = params_class
    for part in path.split(".")[:-1]:
        field = getattr(model, "model_fields", {}).get(part)
        model = field.annotation if field is not None else None
    return sorted(getattr(model, "model_fields", {}))


def _number(value: Any) -> Any:
    """0.0 -> 0: bounds read as the operator would write them."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _shown(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."
