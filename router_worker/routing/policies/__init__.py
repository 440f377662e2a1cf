"""Routing policies behind one interface, and the registry the control plane uses.

``REGISTRY[kind]`` is the policy class; ``RoutingPolicy.Params`` its pydantic v2
parameter model (``Params.model_json_schema()`` for operator forms);
``DESCRIPTIONS[kind]`` a one-line description. ``make_policy(kind, params,
seed)`` validates and builds, raising :class:`PolicyConfigError` that names the
offending field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from router_worker.routing.policies.base import (
    Decision,
    Migration,
    NoEligibleInstanceError,
    PolicyParams,
    QueuedRequest,
    RoutingPolicy,
)
from router_worker.routing.policies.cache_aware import CacheAwarePolicy
from router_worker.routing.policies.decode_room import DecodeRoomPolicy
from router_worker.routing.policies.dualmap import DualMapPolicy
from router_worker.routing.policies.least_load import LeastLoadPolicy
from router_worker.routing.policies.linear import LinearPolicy
from router_worker.routing.policies.llmd import LlmdPolicy, LlmdPrecisePolicy
from router_worker.routing.policies.lmetric import LMetricPolicy
from router_worker.routing.policies.messages import ParamProblem, param_problems
from router_worker.routing.policies.preble import PreblePolicy
from router_worker.routing.policies.predicted_ttft import PredictedTTFTPolicy
from router_worker.routing.policies.round_robin import RoundRobinPolicy
from router_worker.routing.policies.smetric import SMetricPolicy

REGISTRY: dict[str, type[RoutingPolicy]] = {
    cls.kind: cls
    for cls in (
        RoundRobinPolicy,
        LeastLoadPolicy,
        LinearPolicy,
        CacheAwarePolicy,
        PreblePolicy,
        DualMapPolicy,
        LMetricPolicy,
        SMetricPolicy,
        DecodeRoomPolicy,
        LlmdPolicy,
        LlmdPrecisePolicy,
        PredictedTTFTPolicy,
    )
}
DESCRIPTIONS: dict[str, str] = {kind: cls.description for kind, cls in REGISTRY.items()}


class PolicyConfigError(ValueError):
    """Unknown policy kind or invalid parameters; the message names the field."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def validate_params(kind: str, params: Mapping[str, Any] | None) -> PolicyParams:
    """Validate ``params`` for ``kind`` with the policy's own Params class."""
    cls = REGISTRY.get(kind)
    if cls is None:
        known = ", ".join(sorted(REGISTRY))
        raise PolicyConfigError(f"unknown policy kind {kind!r} (known: {known})", "kind")
    try:
        return cls.Params.model_validate(dict(params or {}))
    except ValidationError as exc:
        first = param_problems(kind, cls.Params, exc)[0]
        raise PolicyConfigError(first.message, first.path or "params") from exc


def make_policy(kind: str, params: Mapping[str, Any] | None = None, seed: int = 0) -> RoutingPolicy:
    """Build a validated policy instance."""
    return REGISTRY[kind](validate_params(kind, params), seed)


__all__ = [
    "DESCRIPTIONS",
    "REGISTRY",
    "Decision",
    "Migration",
    "NoEligibleInstanceError",
    "ParamProblem",
    "PolicyConfigError",
    "PolicyParams",
    "QueuedRequest",
    "RoutingPolicy",
    "make_policy",
    "param_problems",
    "validate_params",
]
