"""Validation with the routing core's own parameter classes (one source of truth)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from router_worker.routing.policies import REGISTRY, param_problems

from .errors import Invalid, ServiceError


def policy_kinds() -> dict[str, dict[str, Any]]:
    """Every policy kind with its description and JSON schema of parameters."""
    return {
        kind: {"description": cls.description, "schema": cls.Params.model_json_schema()}
        for kind, cls in sorted(REGISTRY.items())
    }


def normalised_params(kind: str, params: dict[str, Any] | None) -> dict[str, Any]:
    """Validate `params` for `kind`; return them with every default filled in."""
    policy_class = REGISTRY.get(kind)
    if policy_class is None:
        raise ServiceError(f"unknown policy kind {kind!r}; known: {sorted(REGISTRY)}", "kind")
    if params is not None and not isinstance(params, dict):
        raise ServiceError("params must be a JSON object", "params")
    try:
        validated = policy_class.Params.model_validate(params or {})
    except ValidationError as error:
        raise Invalid(
            [
                {
                    "field": ".".join(filter(None, ("params", problem.path))),
                    "message": problem.message,
                }
                for problem in param_problems(kind, policy_class.Params, error)
            ]
        ) from None
    return validated.model_dump(mode="json")
