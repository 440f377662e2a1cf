"""Forms generated from a policy's parameter JSON schema (pydantic's), and back.

Nested objects (`$ref` into `$defs`) become dotted field names (`hotspot.window_s`); the
posted values are rebuilt into nested params, then validated by the policy's own class in
the service, so this module never decides what is valid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.http import QueryDict

PREFIX = "param."


@dataclass(frozen=True)
class ParamField:
    name: str  # dotted path inside params
    label: str
    kind: str  # boolean | integer | number | choice | text
    default: Any = None
    description: str = ""
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    nullable: bool = False

    @property
    def input_name(self) -> str:
        return PREFIX + self.name

    @property
    def step(self) -> str:
        return "1" if self.kind == "integer" else "any"


def param_fields(schema: dict[str, Any]) -> list[ParamField]:
    return list(_walk(schema, schema.get("$defs", {}), ""))


def _walk(schema: dict[str, Any], defs: dict[str, Any], prefix: str):
    for key, prop in schema.get("properties", {}).items():
        resolved = _resolve(prop, defs)
        name = f"{prefix}{key}"
        if resolved.get("type") == "object" and "properties" in resolved:
            yield from _walk(resolved, defs, f"{name}.")
        else:
            yield _field(name, prop, resolved)


def _resolve(prop: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in prop:
        return {**defs[prop["$ref"].rsplit("/", 1)[-1]], **{k: v for k, v in prop.items()
                                                           if k != "$ref"}}
    options = [o for o in prop.get("anyOf", []) if o.get("type") != "null"]
    if options:
        return {**prop, **_resolve(options[0], defs), "nullable": True}
    return prop


def _field(name: str, prop: dict[str, Any], resolved: dict[str, Any]) -> ParamField:
    kind = "choice" if "enum" in resolved else {
        "boolean": "boolean", "integer": "integer", "number": "number"}.get(
            resolved.get("type", ""), "text")
    return ParamField(
        name=name, label=resolved.get("title") or name, kind=kind,
        default=prop.get("default", resolved.get("default")),
        description=prop.get("description") or resolved.get("description", ""),
        minimum=resolved.get("minimum", resolved.get("exclusiveMinimum")),
        maximum=resolved.get("maximum", resolved.get("exclusiveMaximum")),
        choices=tuple(str(c) for c in resolved.get("enum", ())),
        nullable=bool(resolved.get("nullable")),
    )


def params_from_form(fields: list[ParamField], data: QueryDict) -> dict[str, Any]:
    """Nested params from posted fields; blank inputs are left to the defaults."""
    params: dict[str, Any] = {}
    for field in fields:
        value = _value(field, data)
        if value is _UNSET:
            continue
        *parents, leaf = field.name.split(".")
        node = params
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    return params


_UNSET = object()


def _value(field: ParamField, data: QueryDict) -> Any:
    if field.kind == "boolean":
        return data.get(field.input_name) in {"on", "true", "1"}
    raw = (data.get(field.input_name) or "").strip()
    if not raw:
        return None if field.nullable and field.input_name in data else _UNSET
    if field.kind in {"integer", "number"}:
        try:
            return int(raw) if field.kind == "integer" and raw.lstrip("-").isdigit() \
                else float(raw)
        except ValueError:
            return raw  # the policy's class names the field and the problem
    return raw
