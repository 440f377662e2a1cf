"""One applied configuration version: arms, their policies and restricted views.

The router keeps a single :class:`ClusterState` for the whole life of the process (so
the KV shadow index and in-flight accounting survive config changes) and builds a new
immutable :class:`Runtime` per configuration version. A request takes the current
runtime once, on arrival, and uses it to the end: swapping the reference *is* the
atomic apply, and in-flight requests finish on the version they started with.

A canary arm's policy sees the shared state through an :class:`ArmView`, a
``ClusterView`` whose ``eligible`` mask is restricted to the arm's instances. Without
a canary there is one arm, ``default``, over every instance.

A disaggregated cluster (router_worker.routing.disagg) gives each arm a :class:`Stages`:
the arm's prefill pool and decode pool as views of their own, and the decode stage's
policy; the arm's policy places prefill attempts (and colocated requests on the decode
pool), so it is chosen and canaried as today.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from router_worker.arms import arm_salt, pick_arm
from router_worker.contract.config import ArmSpec, PolicySpec, RouterConfig
from router_worker.routing import ClusterState, RoutingPolicy, make_policy
from router_worker.routing.disagg import MemberView, in_decode_pool, in_prefill_pool
from router_worker.tokenization import Tokenizer

DEFAULT_ARM = "default"


class ArmView(MemberView):
    """The shared cluster view with eligibility restricted to one arm's slots (or one of
    its pools)."""


@dataclass
class Stages:
    """An arm's two pools in a disaggregated cluster, and the decode stage's policy."""

    prefill_view: ArmView
    decode_view: ArmView
    decode_policy: RoutingPolicy


@dataclass
class Arm:
    name: str
    spec: PolicySpec
    policy: RoutingPolicy
    instances: tuple[str, ...]
    weight: float
    view: ArmView
    stages: Stages | None = None

    @property
    def policy_kind(self) -> str:
        return self.spec.kind


@dataclass
class Runtime:
    config: RouterConfig
    arms: tuple[Arm, ...]
    cumulative_weights: tuple[float, ...]
    urls: dict[str, str]
    tokenizer: Tokenizer
    random_arms: bool = False
    # sha256 of each valid client key -> its rights (see router_worker/access.py)
    client_keys: dict[str, frozenset[str]] = field(default_factory=dict)
    key_tenants: dict[str, str] = field(default_factory=dict)  # sha256 -> tenant
    rng: random.Random = field(default_factory=random.Random)
    salt: bytes = field(default_factory=lambda: arm_salt(""))  # the canary's (arms.py)
    upstream_cache: dict[tuple[str, str], Any] = field(default_factory=dict)

    @property
    def version(self) -> int:
        return self.config.version

    def arm_for(self, session_key: str | None) -> Arm:
        key = None if self.random_arms else session_key
        return self.arms[pick_arm(self.cumulative_weights, key, self.rng, self.salt)]

    def arm_of_instance(self) -> dict[str, str]:
        return {name: arm.name for arm in self.arms for name in arm.instances}


def _members(state: ClusterState, names: Sequence[str]) -> np.ndarray:
    mask = np.zeros(len(state.ids), dtype=bool)
    for name in names:
        mask[state.slot_of(name)] = True
    return mask


def _stages(
    config: RouterConfig,
    state: ClusterState,
    instances: Sequence[str],
    kept: Stages | None,
    decode_spec: PolicySpec | None,
) -> Stages | None:
    """An arm's pools and its decode stage's policy (``decode_spec``: the arm's own, else
    the cluster's)."""
    if not config.disaggregated:
        return None
    roles = {i.name: i.role for i in config.instances}
    prefill = [n for n in instances if in_prefill_pool(roles[n])]
    decode = [n for n in instances if in_decode_pool(roles[n])]
    spec = decode_spec or config.stages.decode_policy
    policy = make_policy(spec.kind, spec.params, spec.seed)
    same = kept is not None and type(kept.decode_policy) is type(policy)
    if same and kept is not None and kept.decode_policy.params == policy.params:
        policy = kept.decode_policy  # its windows survive unrelated changes
    return Stages(
        ArmView(state, _members(state, prefill)), ArmView(state, _members(state, decode)), policy
    )


def _arm_specs(config: RouterConfig) -> list[ArmSpec]:
    if config.canary is None:
        names = [i.name for i in config.instances]
        return [ArmSpec(name=DEFAULT_ARM, policy=config.policy, weight=100.0, instances=names)]
    return list(config.canary.arms)


def build_runtime(
    config: RouterConfig, state: ClusterState, tokenizer: Tokenizer, previous: Runtime | None
) -> Runtime:
    """Arms for ``config`` over ``state`` (instances must already be in the state).

    A policy object is kept from ``previous`` when its arm has the same name, policy spec
    and instances, so its windows (hotspot detector, session table) survive unrelated
    changes.
    """
    old = {arm.name: arm for arm in previous.arms} if previous else {}
    arms = []
    cumulative, total = [], 0.0
    for arm_spec in _arm_specs(config):
        name, spec, weight = arm_spec.name, arm_spec.policy, arm_spec.weight
        instances = tuple(arm_spec.instances)
        kept = old.get(name)
        if kept is not None and kept.spec == spec and kept.instances == instances:
            policy = kept.policy
        else:
            policy = make_policy(spec.kind, spec.params, spec.seed)
        view = ArmView(state, _members(state, instances))
        kept_stages = kept.stages if kept is not None else None
        stages = _stages(config, state, instances, kept_stages, arm_spec.decode_policy)
        arms.append(Arm(name, spec, policy, instances, weight, view, stages))
        total += weight
        cumulative.append(total)
    urls = {i.name: i.url for i in config.instances}
    random_arms = config.canary is not None and config.canary.assignment_key == "random"
    client_keys: dict[str, frozenset[str]] = {
        key.sha256: frozenset(key.rights) for key in config.client_auth.keys
    }
    key_tenants = {key.sha256: key.tenant for key in config.client_auth.keys}
    salt = arm_salt(config.canary.salt if config.canary is not None else "")
    return Runtime(
        config,
        tuple(arms),
        tuple(cumulative),
        urls,
        tokenizer,
        random_arms,
        client_keys,
        key_tenants,
        salt=salt,
    )
