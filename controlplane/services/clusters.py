"""Clusters and their instances."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError, transaction
from pydantic import ValidationError as PydanticValidationError

from controlplane.models import Cluster, Instance
from enginesim.replay.policy_costs import UnknownHardwareError, gpu_key, model_key
from router_worker.contract.config import InstanceSpec
from router_worker.routing.sessions import SESSION_SOURCES

from . import audit, config
from .audit import Actor
from .errors import Conflict, NotFound, ServiceError, StaleEdit
from .fields import max_length
from .numbers import whole_number

MIN_BLOCK_SIZE = 1
MAX_BLOCK_SIZE = 4096


def instance_snapshot(instance: Instance) -> dict:
    return {
        "name": instance.name,
        "url": instance.url,
        "state": instance.state,
        "kv_events": instance.kv_events,
        "role": instance.role,
        "grey_override": instance.grey_override,
    }


def cluster_snapshot(cluster: Cluster) -> dict:
    return {
        "name": cluster.name,
        "model": cluster.model,
        "gpu_type": cluster.gpu_type,
        "block_size": cluster.block_size,
    }


def _full_clean(obj, fields: tuple[str, ...]) -> None:
    try:
        obj.full_clean(
            exclude=[f.name for f in obj._meta.fields if f.name not in fields],
            validate_unique=False,
        )
    except DjangoValidationError as error:
        field, messages = next(iter(error.message_dict.items()))
        raise ServiceError(f"{field}: {messages[0]}", field) from None


def locked_cluster(cluster_id: int) -> Cluster:
    try:
        return Cluster.objects.select_for_update().get(pk=cluster_id)
    except Cluster.DoesNotExist:
        raise NotFound(f"cluster {cluster_id} does not exist") from None


def claim_edit(cluster: Cluster, expected_revision: int | None) -> None:
    """Refuse an edit prepared against an older revision of the (locked) cluster, then count
    this one. `expected_revision` None: the caller did not say (last writer wins)."""
    if expected_revision is not None and expected_revision != cluster.revision:
        raise StaleEdit(cluster.name, expected_revision, cluster.revision)
    cluster.revision += 1
    cluster.save(update_fields=["revision"])


def check_hardware(gpu_type: str, model: str) -> None:
    """Refuse a GPU or model enginesim's cost model does not know, naming the known ones: a
    typo would otherwise surface only in a replay or a derived policy parameter. Clusters
    stored before this check keep their names; replays and derived parameters refuse them
    with the same message."""
    for field, name, key in (("gpu_type", gpu_type, gpu_key), ("model", model, model_key)):
        try:
            key(name)
        except UnknownHardwareError as error:
            raise ServiceError(f"{field}: {error}", field) from None


@transaction.atomic
def create_cluster(
    actor: Actor, *, name: str, model: str, gpu_type: str, block_size: int = 16, reason: str = ""
) -> Cluster:
    cluster = Cluster(name=name, model=model, gpu_type=gpu_type, block_size=block_size)
    _full_clean(cluster, ("name", "model", "gpu_type", "block_size"))
    check_hardware(gpu_type, model)
    if not MIN_BLOCK_SIZE <= block_size <= MAX_BLOCK_SIZE:
        # The router refuses other sizes, so the first config version could never be built.
        raise ServiceError(
            f"block_size must be in {MIN_BLOCK_SIZE}..{MAX_BLOCK_SIZE}", "block_size"
        )
    try:
        with transaction.atomic():
            cluster.save()
    except IntegrityError:
        raise Conflict(f"a cluster named {name!r} already exists", "name") from None
    audit.record(
        actor,
        "cluster.create",
        cluster,
        after=cluster_snapshot(cluster),
        reason=reason,
        cluster=cluster,
    )
    return cluster


@transaction.atomic
def add_instance(
    actor: Actor,
    cluster_id: int,
    *,
    name: str,
    url: str,
    kv_events: str = "",
    reason: str,
    expected_revision: int | None = None,
) -> Instance:
    reason = audit.require_reason(reason)
    cluster = locked_cluster(cluster_id)
    claim_edit(cluster, expected_revision)
    instance = Instance(cluster=cluster, name=name, url=_router_url(url), kv_events=kv_events)
    _full_clean(instance, ("name", "kv_events"))
    try:
        with transaction.atomic():
            instance.save()
    except IntegrityError:
        raise Conflict(f"instance {name!r} already exists in {cluster.name}", "name") from None
    version = config.publish(cluster, actor, reason)
    audit.record(
        actor,
        "instance.add",
        instance,
        after=_with_version(instance_snapshot(instance), version),
        reason=reason,
        cluster=cluster,
    )
    return instance


def set_instance_state(
    actor: Actor, instance_id: int, state: str, *, reason: str, expected_revision: int | None = None
) -> Instance:
    """Enable, drain or mark down an instance."""
    return _set_instance_field(
        actor,
        instance_id,
        "state",
        state,
        reason=reason,
        expected_revision=expected_revision,
        action=lambda value: f"instance.{_verb(value)}",
        already="is already {value}",
    )


def set_grey_override(
    actor: Actor, instance_id: int, mode: str, *, reason: str, expected_revision: int | None = None
) -> Instance:
    """The operator's word on grey-failure detection for one instance (``auto``,
    ``healthy``: never flagged slow, ``drained``: no traffic, no probes), published to the
    routers in a new config version and audited."""
    return _set_instance_field(
        actor,
        instance_id,
        "grey_override",
        mode,
        reason=reason,
        expected_revision=expected_revision,
        param="mode",
        already="already has grey override {value}",
    )


def set_instance_role(
    actor: Actor, instance_id: int, role: str, *, reason: str, expected_revision: int | None = None
) -> Instance:
    """Move an instance between the prefill and decode pools (or both): the pools' sizes
    of a disaggregated cluster. Refused when it would leave a disaggregated cluster without
    a prefill or a decode pool."""
    return _set_instance_field(
        actor,
        instance_id,
        "role",
        role,
        reason=reason,
        expected_revision=expected_revision,
        check=_keeps_both_pools,
    )


def _keeps_both_pools(instance: Instance, role: str) -> None:
    roles = {i.pk: i.role for i in instance.cluster.instances.all()}
    roles[instance.pk] = role
    values = set(roles.values())
    if values != {"both"} and not (values & {"prefill", "both"} and values & {"decode", "both"}):
        pool = "prefill" if not values & {"prefill", "both"} else "decode"
        raise ServiceError(f"role: the cluster would have no {pool} pool", "role")


_CHOICES = {
    "state": Instance.State.values,
    "role": Instance.Role.values,
    "grey_override": Instance.GreyOverride.values,
}


@transaction.atomic
def _set_instance_field(
    actor: Actor,
    instance_id: int,
    field: str,
    value: str,
    *,
    reason: str,
    expected_revision: int | None,
    param: str | None = None,
    action: Callable[[str], str] | None = None,
    already: str = "is already {value}",
    check: Callable[[Instance, str], None] | None = None,
) -> Instance:
    """Set one of an instance's choice fields (``field``, named ``param`` in the request),
    publish the config and audit it as ``action`` (default ``instance.<field>``). ``check``
    refuses a value the cluster cannot take."""
    reason = audit.require_reason(reason)
    instance = _locked_instance(instance_id)
    claim_edit(instance.cluster, expected_revision)
    choices = _CHOICES[field]
    if value not in choices:
        raise ServiceError(f"{field} must be one of {choices}", param or field)
    if getattr(instance, field) == value:
        message = already.format(value=value)
        raise Conflict(f"instance {instance.name!r} {message}", param or field)
    if check is not None:
        check(instance, value)
    before = instance_snapshot(instance)
    setattr(instance, field, value)
    instance.save(update_fields=[field])
    version = config.publish(instance.cluster, actor, reason)
    audit.record(
        actor,
        action(value) if action else f"instance.{field}",
        instance,
        before=before,
        after=_with_version(instance_snapshot(instance), version),
        reason=reason,
        cluster=instance.cluster,
    )
    return instance


DECIDER_FIELDS = ("decider", "decider_threshold_tokens", "kv_link")
MAX_THRESHOLD_TOKENS = 10_000_000


@transaction.atomic
def set_decider(
    actor: Actor,
    cluster_id: int,
    kind: str,
    *,
    threshold_tokens: Any = None,
    kv_link: str | None = None,
    reason: str,
    expected_revision: int | None = None,
) -> Cluster:
    """Choose when the cluster's routers split a request into its prefill and decode calls
    (``Cluster.Decider``: the live cost, llm-d's prefix threshold, always, never), the
    prefix threshold's tokens and the prefill → decode link the cost weighs (None: kept);
    they apply while some instance is of role prefill or decode."""
    reason = audit.require_reason(reason)
    cluster = locked_cluster(cluster_id)
    claim_edit(cluster, expected_revision)
    after = _decider_settings(cluster, kind, threshold_tokens, kv_link)
    before = {name: getattr(cluster, name) for name in DECIDER_FIELDS}
    if after == before:
        raise Conflict(
            f"the decider of {cluster.name} is already {kind} (threshold "
            f"{cluster.decider_threshold_tokens} tokens, {cluster.kv_link} link)",
            "decider",
        )
    return _set_cluster_settings(actor, cluster, "cluster.decider", after, reason)


def _decider_settings(
    cluster: Cluster, kind: str, threshold_tokens: Any, kv_link: str | None
) -> dict[str, Any]:
    """The decider's settings as asked (each checked, field by field), unset ones kept."""
    if kind not in Cluster.Decider.values:
        raise ServiceError(f"decider must be one of {Cluster.Decider.values}", "decider")
    threshold = cluster.decider_threshold_tokens
    if isinstance(threshold_tokens, int) and not isinstance(threshold_tokens, bool):
        threshold_tokens = str(threshold_tokens)
    if threshold_tokens not in (None, ""):
        threshold = whole_number(
            threshold_tokens, "threshold_tokens", minimum=0, maximum=MAX_THRESHOLD_TOKENS
        )
    link = cluster.kv_link if kv_link in (None, "") else kv_link
    if link not in Cluster.KvLink.values:
        raise ServiceError(f"kv_link must be one of {Cluster.KvLink.values}", "kv_link")
    return {"decider": kind, "decider_threshold_tokens": threshold, "kv_link": link}


@transaction.atomic
def remove_instance(
    actor: Actor, instance_id: int, *, reason: str, expected_revision: int | None = None
) -> None:
    reason = audit.require_reason(reason)
    instance = _locked_instance(instance_id)
    cluster = instance.cluster
    claim_edit(cluster, expected_revision)
    in_canary = [
        c.name
        for c in cluster.canaries.filter(state__in=("progressing", "paused"))
        if instance.name in c.baseline_instances + c.candidate_instances
    ]
    if in_canary:
        raise Conflict(f"instance {instance.name!r} is part of running canary {in_canary[0]!r}")
    if cluster.versions.exists() and cluster.instances.count() == 1:
        # A router config needs at least one instance: without this the routers would keep
        # serving the last version, which still lists the removed instance.
        raise Conflict(
            f"{instance.name!r} is the last instance of {cluster.name}; "
            "add another before removing it"
        )
    before = instance_snapshot(instance)
    audit_target = Instance(pk=instance.pk)
    instance.delete()
    version = config.publish(cluster, actor, reason)
    audit.record(
        actor,
        "instance.remove",
        audit_target,
        before=before,
        after=_with_version({}, version),
        reason=reason,
        cluster=cluster,
    )


def _router_url(url: str) -> str:
    """The router's own URL rule (any http(s) host, e.g. `http://engine-0:8000`), not
    Django's URLValidator, which refuses single-label hosts."""
    if len(url) > max_length(Instance, "url"):
        raise ServiceError("url: at most 256 characters", "url")
    try:
        return InstanceSpec(name="probe", url=url).url
    except PydanticValidationError as error:
        raise ServiceError(f"url: {error.errors()[0]['msg']}", "url") from None


def _locked_instance(instance_id: int) -> Instance:
    try:
        instance = Instance.objects.select_related("cluster").get(pk=instance_id)
    except Instance.DoesNotExist:
        raise NotFound(f"instance {instance_id} does not exist") from None
    locked_cluster(instance.cluster_id)
    return Instance.objects.select_for_update().select_related("cluster").get(pk=instance_id)


def _verb(state: str) -> str:
    return {"enabled": "enable", "draining": "drain", "down": "mark_down"}[state]


def _with_version(snapshot: dict, version) -> dict:
    return {**snapshot, "config_version": version.number if version else None}


@transaction.atomic
def set_session_sources(
    actor: Actor,
    cluster_id: int,
    sources: list[str],
    *,
    reason: str,
    expected_revision: int | None = None,
) -> Cluster:
    """Choose where the cluster's routers read a request's session from (any of
    ``SESSION_SOURCES``; the order they are read in is fixed)."""
    reason = audit.require_reason(reason)
    cluster = locked_cluster(cluster_id)
    claim_edit(cluster, expected_revision)
    unknown = [s for s in sources if s not in SESSION_SOURCES]
    if unknown or len(set(sources)) != len(sources):
        raise ServiceError(
            f"session_sources must be distinct values among {list(SESSION_SOURCES)}, got {sources}",
            "session_sources",
        )
    chosen = [s for s in SESSION_SOURCES if s in sources]  # the order they are read in
    if list(cluster.session_sources) == chosen:
        raise Conflict(f"the session sources of {cluster.name} are already {chosen}", "sources")
    values = {"session_sources": chosen}
    return _set_cluster_settings(actor, cluster, "cluster.session_sources", values, reason)


MAX_TPOT_SLO_MS = 60_000  # the routers' bound (FlowParams.tpot_slo_s ≤ 60 s)


@transaction.atomic
def set_flow_tpot_slo(
    actor: Actor,
    cluster_id: int,
    tpot_slo_ms: Any,
    *,
    reason: str,
    expected_revision: int | None = None,
) -> Cluster:
    """Set (a whole number of ms, 1 to ``MAX_TPOT_SLO_MS``) or clear (None) the TPOT SLO
    the cluster's routers hold admission to: flow control then keeps the engines' step
    time under it, and runs on a cluster without tenants too."""
    reason = audit.require_reason(reason)
    cluster = locked_cluster(cluster_id)
    claim_edit(cluster, expected_revision)
    if tpot_slo_ms is not None:
        if isinstance(tpot_slo_ms, str):
            tpot_slo_ms = whole_number(tpot_slo_ms, "tpot_slo_ms")
        if isinstance(tpot_slo_ms, bool) or not isinstance(tpot_slo_ms, int):
            raise ServiceError(f"tpot_slo_ms: {tpot_slo_ms!r} is not a whole number", "tpot_slo_ms")
        if not 1 <= tpot_slo_ms <= MAX_TPOT_SLO_MS:
            raise ServiceError(
                f"tpot_slo_ms: {tpot_slo_ms} is outside 1 to {MAX_TPOT_SLO_MS}", "tpot_slo_ms"
            )
    if cluster.flow_tpot_slo_ms == tpot_slo_ms:
        shown = "off" if tpot_slo_ms is None else f"{tpot_slo_ms} ms"
        raise Conflict(f"the TPOT SLO of {cluster.name} is already {shown}", "tpot_slo_ms")
    values = {"flow_tpot_slo_ms": tpot_slo_ms}
    return _set_cluster_settings(actor, cluster, "cluster.flow_tpot_slo", values, reason)


def _set_cluster_settings(
    actor: Actor, cluster: Cluster, action: str, values: dict[str, Any], reason: str
) -> Cluster:
    """Store routing settings of a locked cluster, publish the routers' new config and
    audit it as ``action``, before and after (the caller has validated the values)."""
    before = {}
    for field, value in values.items():
        old = getattr(cluster, field)
        before[field] = list(old) if isinstance(old, list) else old
        setattr(cluster, field, value)
    cluster.save(update_fields=list(values))
    version = config.publish(cluster, actor, reason)
    audit.record(
        actor,
        action,
        cluster,
        before=before,
        after=_with_version(dict(values), version),
        reason=reason,
        cluster=cluster,
    )
    return cluster
