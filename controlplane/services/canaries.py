"""Canary splits: a baseline and a candidate arm side by side, stepped by the judge."""

from __future__ import annotations

import functools
import itertools
import json
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.utils import timezone

from controlplane.models import CanarySplit, Cluster, Policy

from . import audit, config
from .audit import Actor
from .clusters import _full_clean, claim_edit, locked_cluster
from .errors import Conflict, NotFound, ServiceError
from .guardrails import Guardrails, validate_guardrails

TRANSITIONS: dict[str, tuple[tuple[str, ...], str]] = {
    # action: (states it may start from, resulting state)
    "start": (("draft",), "progressing"),
    "pause": (("progressing",), "paused"),
    "resume": (("paused",), "progressing"),
    "promote": (("progressing", "paused"), "promoted"),
    "abort": (("draft", "progressing", "paused"), "aborted"),
    "rollback": (("progressing", "paused"), "rolled_back"),
}


def canary_snapshot(canary: CanarySplit) -> dict[str, Any]:
    return {
        "name": canary.name,
        "state": canary.state,
        "baseline_policy": canary.baseline_policy.name,
        "candidate_policy": canary.candidate_policy.name,
        "candidate_decode_policy": (
            canary.candidate_decode_policy.name if canary.candidate_decode_policy else None
        ),
        "baseline_instances": canary.baseline_instances,
        "candidate_instances": canary.candidate_instances,
        "weight_steps": canary.weight_steps,
        "step_index": canary.step_index,
        "candidate_weight": canary.candidate_weight,
        "guardrails": canary.guardrails,
        "assignment_key": canary.assignment_key,
        "failures": canary.failures,
        "source_replay": canary.source_replay_id,
    }


def _validate_split(cluster: Cluster, baseline: list[str], candidate: list[str]) -> None:
    known = set(cluster.instances.values_list("name", flat=True))
    for field, names in (("baseline_instances", baseline), ("candidate_instances", candidate)):
        if not isinstance(names, list) or not names:
            raise ServiceError(f"{field} must name at least one instance", field)
        unknown = sorted(set(names) - known)
        if unknown:
            raise ServiceError(f"{field}: unknown instances {unknown}", field)
        if len(set(names)) != len(names):
            raise ServiceError(f"{field}: an instance is listed twice", field)
    overlap = sorted(set(baseline) & set(candidate))
    if overlap:
        raise ServiceError(
            f"candidate_instances overlap baseline_instances: {overlap}", "candidate_instances"
        )


def _validate_steps(steps: list[float]) -> list[float]:
    if not isinstance(steps, list) or not steps:
        raise ServiceError("weight_steps must list at least one candidate weight", "weight_steps")
    if any(
        isinstance(s, bool) or not isinstance(s, int | float) or not 0 < s <= 100 for s in steps
    ):
        raise ServiceError("weight_steps must be percentages in (0, 100]", "weight_steps")
    if any(b <= a for a, b in itertools.pairwise(steps)):
        raise ServiceError("weight_steps must increase", "weight_steps")
    return [float(s) for s in steps]


DEFAULT_WEIGHT_STEPS: list[float] = [10, 25, 50]
DEFAULTS_SETTING = "SWITCHYARD_CANARY_DEFAULTS"


@dataclass(frozen=True)
class CanaryDefaults:
    """What a canary gets for what its creator leaves out: the built-in values, overridden
    by this deployment's ``SWITCHYARD_CANARY_DEFAULTS`` (a demo serving one request a
    second needs fewer samples per step than a production fleet)."""

    guardrails: Guardrails
    weight_steps: list[float]


@functools.cache
def site_defaults() -> CanaryDefaults:
    """This deployment's defaults; a bad ``SWITCHYARD_CANARY_DEFAULTS`` raises
    ImproperlyConfigured naming the variable and each field at fault."""
    raw = getattr(settings, DEFAULTS_SETTING, "") or "{}"
    try:
        given = json.loads(raw)
    except ValueError as error:
        raise ImproperlyConfigured(f"{DEFAULTS_SETTING} is not JSON: {error}") from None
    if not isinstance(given, dict):
        raise ImproperlyConfigured(f"{DEFAULTS_SETTING} must be a JSON object, got {raw!r}")
    steps = given.pop("weight_steps", DEFAULT_WEIGHT_STEPS)
    try:
        return CanaryDefaults(
            guardrails=validate_guardrails(given, Guardrails()),
            weight_steps=_validate_steps(steps),
        )
    except ServiceError as error:
        raise ImproperlyConfigured(f"{DEFAULTS_SETTING}: {error.message}") from None


def guardrails_of(canary: CanarySplit) -> Guardrails:
    """The canary's stored guardrails (``Guardrails.of_stored``: the built-in default for
    any it was created without)."""
    return Guardrails.of_stored(canary.guardrails)


@transaction.atomic
def create_canary(
    actor: Actor,
    cluster_id: int,
    *,
    name: str,
    baseline_policy_id: int,
    candidate_policy_id: int,
    baseline_instances: list[str],
    candidate_instances: list[str],
    candidate_decode_policy_id: int | None = None,
    weight_steps: list[float] | None = None,
    guardrails: dict[str, Any] | None = None,
    assignment_key: str = "session",
    source_replay_id: int | None = None,
    reason: str,
) -> CanarySplit:
    """A draft canary; ``source_replay_id``: the replay job whose recommendation it tests
    (the two then link to each other, on their pages and in the audit trail);
    ``candidate_decode_policy_id``: a disaggregated cluster's candidate arm decodes under
    it (the baseline arm under the cluster's decode policy)."""
    reason = audit.require_reason(reason)
    cluster = locked_cluster(cluster_id)
    source = None
    if source_replay_id is not None:
        source = cluster.replays.filter(pk=source_replay_id).first()
        if source is None:
            raise ServiceError(
                f"source_replay_id: replay {source_replay_id} is not one of {cluster.name}'s",
                "source_replay_id",
            )
    chosen = {
        "baseline_policy_id": baseline_policy_id,
        "candidate_policy_id": candidate_policy_id,
        **(
            {"candidate_decode_policy_id": candidate_decode_policy_id}
            if candidate_decode_policy_id is not None
            else {}
        ),
    }
    policies = {p.pk: p for p in cluster.policies.filter(pk__in=chosen.values())}
    for field, pk in chosen.items():
        if pk not in policies:
            raise ServiceError(f"{field}: policy {pk} does not exist in {cluster.name}", field)
    decode = policies.get(candidate_decode_policy_id) if candidate_decode_policy_id else None
    _check_arms_differ(cluster, baseline_policy_id, candidate_policy_id, decode)
    if assignment_key not in ("session", "random"):
        raise ServiceError("assignment_key must be 'session' or 'random'", "assignment_key")
    _validate_split(cluster, baseline_instances, candidate_instances)
    canary = CanarySplit(
        cluster=cluster,
        name=name,
        baseline_policy=policies[baseline_policy_id],
        candidate_policy=policies[candidate_policy_id],
        candidate_decode_policy=decode,
        baseline_instances=baseline_instances,
        candidate_instances=candidate_instances,
        weight_steps=_validate_steps(
            site_defaults().weight_steps if weight_steps is None else weight_steps
        ),
        guardrails=validate_guardrails(guardrails, site_defaults().guardrails).model_dump(),
        assignment_key=assignment_key,
        source_replay=source,
    )
    _full_clean(canary, ("name",))
    canary.save()
    audit.record(
        actor,
        "canary.create",
        canary,
        after=canary_snapshot(canary),
        reason=reason,
        cluster=cluster,
    )
    return canary


def _check_arms_differ(
    cluster: Cluster, baseline_id: int, candidate_id: int, decode: Policy | None
) -> None:
    """The candidate differs from the baseline in its policy or in its decode policy (which
    only a disaggregated cluster has)."""
    if decode is not None and not cluster.is_disaggregated():
        raise ServiceError(
            "candidate_decode_policy_id: the cluster has no decode stage (no instance is of "
            "role prefill or decode)",
            "candidate_decode_policy_id",
        )
    new_decode = decode is not None and decode.pk != cluster.decode_policy_id
    if baseline_id == candidate_id and not new_decode:
        raise ServiceError(
            "candidate_policy_id must differ from baseline_policy_id (or, on a disaggregated "
            "cluster, candidate_decode_policy_id from the cluster's decode policy)",
            "candidate_policy_id",
        )


def _locked_canary(canary_id: int) -> CanarySplit:
    try:
        canary = CanarySplit.objects.get(pk=canary_id)
    except CanarySplit.DoesNotExist:
        raise NotFound(f"canary {canary_id} does not exist") from None
    locked_cluster(canary.cluster_id)
    return (
        CanarySplit.objects.select_for_update()
        .select_related("cluster", "baseline_policy", "candidate_policy")
        .get(pk=canary_id)
    )


@transaction.atomic
def transition(
    actor: Actor,
    canary_id: int,
    action: str,
    *,
    reason: str,
    evidence: dict[str, Any] | None = None,
    expected_revision: int | None = None,
) -> CanarySplit:
    """start / pause / resume / promote / abort / rollback, with audit and a new config."""
    reason = audit.require_reason(reason)
    if action not in TRANSITIONS:
        raise ServiceError(f"unknown canary action {action!r}", "action")
    canary = _locked_canary(canary_id)
    claim_edit(canary.cluster, expected_revision)
    allowed_from, target = TRANSITIONS[action]
    if canary.state not in allowed_from:
        raise Conflict(f"cannot {action} a canary that is {canary.state}")
    cluster = canary.cluster
    if action == "start":
        _require_startable(cluster)
    before = canary_snapshot(canary)
    canary.state = target
    if action == "start":
        canary.step_index = 0
        canary.step_started_at = timezone.now()
    if action == "promote":
        cluster.active_policy = canary.candidate_policy
        if canary.candidate_decode_policy is not None:
            cluster.decode_policy = canary.candidate_decode_policy
        cluster.save(update_fields=["active_policy", "decode_policy"])
    canary.save()
    version = config.publish(cluster, actor, reason)
    after = {**canary_snapshot(canary), "config_version": version.number if version else None}
    if evidence is not None:
        after["evidence"] = evidence
    audit.record(
        actor,
        f"canary.{action}",
        canary,
        before=before,
        after=after,
        reason=reason,
        cluster=cluster,
    )
    return canary


def _require_startable(cluster: Cluster) -> None:
    running = config.active_canary(cluster)
    if running is not None:
        raise Conflict(f"canary {running.name!r} is already running on {cluster.name}")
    if cluster.active_policy_id is None:
        # The router config is built around the active policy; without one no version
        # carrying the canary could be published.
        raise Conflict(f"{cluster.name} has no active policy: activate one first")


@transaction.atomic
def advance_step(
    actor: Actor, canary_id: int, *, reason: str, evidence: dict[str, Any]
) -> CanarySplit:
    """Move the candidate to the next weight step (the judge's 'pass')."""
    canary = _locked_canary(canary_id)
    if canary.state != CanarySplit.State.PROGRESSING:
        raise Conflict(f"cannot advance a canary that is {canary.state}")
    if canary.step_index + 1 >= len(canary.weight_steps):
        raise Conflict("already at the last step: promote instead")
    claim_edit(canary.cluster, None)
    before = canary_snapshot(canary)
    canary.step_index += 1
    canary.step_started_at = timezone.now()
    canary.save()
    version = config.publish(canary.cluster, actor, reason)
    audit.record(
        actor,
        "canary.advance",
        canary,
        before=before,
        after={
            **canary_snapshot(canary),
            "evidence": evidence,
            "config_version": version.number if version else None,
        },
        reason=reason,
        cluster=canary.cluster,
    )
    return canary


@transaction.atomic
def count_failure(actor: Actor, canary_id: int, *, reason: str, evidence: dict[str, Any]) -> int:
    """Record a failed step; the step restarts so the next judgement sees fresh samples."""
    canary = _locked_canary(canary_id)
    claim_edit(canary.cluster, None)
    before = canary_snapshot(canary)
    canary.failures += 1
    canary.step_started_at = timezone.now()
    canary.save(update_fields=["failures", "step_started_at"])
    audit.record(
        actor,
        "canary.step_failed",
        canary,
        before=before,
        after={**canary_snapshot(canary), "evidence": evidence},
        reason=reason,
        cluster=canary.cluster,
    )
    return canary.failures
