"""Forms generated from a policy's parameter JSON schema (pydantic's), and back.

Nested objects (`$ref` into `$defs`) become dotted field names (`hotspot.window_s`); the
posted values are rebuilt into nested params, then validated by the policy's own class in
the service, so this module never decides what is valid beyond reading each number
strictly (the inputs are text: a browser's number input would send a typo as blank).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from django.http import QueryDict

from controlplane.services import numbers
from controlplane.services.errors import Invalid, ServiceError, problems_of
from controlplane.services.validation import normalised_params
from router_worker.routing.provenance import ParamProvenance

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
    exclusive_minimum: bool = False
    exclusive_maximum: bool = False
    posted: str | None = None  # what the operator submitted (None: not submitted)
    error: str = ""  # the policy class's message for this field
    id_prefix: str = "param"  # unique per policy where several are on one page
    provenance: ParamProvenance | None = None  # where the default comes from

    @property
    def input_name(self) -> str:
        return PREFIX + self.name

    @property
    def input_id(self) -> str:
        return f"{self.id_prefix}-{self.name.replace('.', '-')}"

    @property
    def described_by(self) -> str:
        """The ids of the help text (and the error, if any) for aria-describedby."""
        return f"{self.input_id}-help" + (f" {self.input_id}-error" if self.error else "")

    @property
    def value(self) -> str:
        """The input's value: the operator's own text after a refused submit, else the
        default."""
        if self.posted is not None:
            return self.posted
        return "" if self.default is None else str(self.default)

    @property
    def checked(self) -> bool:
        if self.posted is not None:
            return self.posted in CHECKED
        return bool(self.default)

    @property
    def default_text(self) -> str:
        if self.kind == "boolean":
            return "on" if self.default else "off"
        return "none" if self.default is None else str(self.default)

    @property
    def inputmode(self) -> str:
        """The on-screen keyboard for a number (the input itself is text: see the module)."""
        return "numeric" if self.kind == "integer" else "decimal"

    @property
    def bounds(self) -> str:
        """The allowed range as the schema states it: "≥ 0", "> 0", "0 – 1", "> 0, ≤ 1"."""
        low = (
            None
            if self.minimum is None
            else _bound(">" if self.exclusive_minimum else "≥", self.minimum)
        )
        high = (
            None
            if self.maximum is None
            else _bound("<" if self.exclusive_maximum else "≤", self.maximum)
        )
        if (
            self.minimum is not None
            and self.maximum is not None
            and not (self.exclusive_minimum or self.exclusive_maximum)
        ):
            return f"{_num(self.minimum)} – {_num(self.maximum)}"
        return ", ".join(part for part in (low, high) if part)


CHECKED = frozenset({"on", "true", "1"})


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _bound(sign: str, value: float) -> str:
    return f"{sign} {_num(value)}"


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
        return {
            **defs[prop["$ref"].rsplit("/", 1)[-1]],
            **{k: v for k, v in prop.items() if k != "$ref"},
        }
    options = [o for o in prop.get("anyOf", []) if o.get("type") != "null"]
    if options:
        return {**prop, **_resolve(options[0], defs), "nullable": True}
    return prop


def _field(name: str, prop: dict[str, Any], resolved: dict[str, Any]) -> ParamField:
    kind = (
        "choice"
        if "enum" in resolved
        else {"boolean": "boolean", "integer": "integer", "number": "number"}.get(
            resolved.get("type", ""), "text"
        )
    )
    return ParamField(
        name=name,
        label=resolved.get("title") or name,
        kind=kind,
        default=prop.get("default", resolved.get("default")),
        description=prop.get("description") or resolved.get("description", ""),
        minimum=resolved.get("minimum", resolved.get("exclusiveMinimum")),
        maximum=resolved.get("maximum", resolved.get("exclusiveMaximum")),
        choices=tuple(str(c) for c in resolved.get("enum", ())),
        nullable=bool(resolved.get("nullable")),
        exclusive_minimum="minimum" not in resolved and "exclusiveMinimum" in resolved,
        exclusive_maximum="maximum" not in resolved and "exclusiveMaximum" in resolved,
        provenance=ParamProvenance.from_schema(prop) or ParamProvenance.from_schema(resolved),
    )


def bind(
    fields: list[ParamField], data: Mapping[str, Any], errors: Mapping[str, str]
) -> list[ParamField]:
    """The fields as the operator submitted them, each with its own error (``errors`` keyed
    by the service's field path, ``params.<name>``), so a refused form loses nothing."""
    return [
        replace(
            field,
            posted=str(data.get(field.input_name, "")),
            error=errors.get(f"params.{field.name}", ""),
        )
        for field in fields
    ]


def with_values(
    fields: list[ParamField], params: Mapping[str, Any], id_prefix: str
) -> list[ParamField]:
    """The fields showing a stored policy's values (read-only summaries)."""
    shown = []
    for field in fields:
        node: Any = params
        for part in field.name.split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        value = "" if node is None else str(node).lower() if isinstance(node, bool) else str(node)
        shown.append(replace(field, posted=value, id_prefix=id_prefix))
    return shown


def params_from_form(kind: str, fields: list[ParamField], data: QueryDict) -> dict[str, Any]:
    """Nested params from posted fields. A blank input is left to the default (never a
    null by accident); a nullable field is set to null only by typing ``none``. A number is
    read strictly (controlplane/services/numbers.py, as every form reads numbers): an
    unreadable one is refused (Invalid), named, together with every problem the policy's
    class finds in the rest, and nothing is stored."""
    params: dict[str, Any] = {}
    unreadable: list[dict[str, Any]] = []
    for field in fields:
        try:
            value = _value(field, data)
        except ServiceError:
            raw = (data.get(field.input_name) or "").strip()
            what = "a whole number" if field.kind == "integer" else "a number"
            shown = raw if len(raw) <= 40 else raw[:40] + "…"
            unreadable.append(
                {
                    "field": f"params.{field.name}",
                    "message": f"{kind}.{field.name}: must be {what} (got {shown!r})",
                }
            )
            continue
        if value is _UNSET:
            continue
        *parents, leaf = field.name.split(".")
        node = params
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    if unreadable:
        try:
            normalised_params(kind, params)
        except ServiceError as error:
            named = {p["field"] for p in unreadable}
            unreadable += [p for p in problems_of(error) if p["field"] not in named]
        raise Invalid(unreadable)
    return params


_UNSET = object()
NONE_WORDS = frozenset({"none", "null"})


def _value(field: ParamField, data: QueryDict) -> Any:
    if field.kind == "boolean":
        return data.get(field.input_name) in CHECKED
    raw = (data.get(field.input_name) or "").strip()
    if not raw:
        return _UNSET
    if field.nullable and raw.lower() in NONE_WORDS:
        return None
    if field.kind == "integer":
        return numbers.whole_number(raw, f"params.{field.name}")
    if field.kind == "number":
        return numbers.number(raw, f"params.{field.name}")
    return raw
