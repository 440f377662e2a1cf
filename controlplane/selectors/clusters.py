"""Clusters, their instances, policies and config versions."""

from __future__ import annotations

from django.db.models import QuerySet

from controlplane.models import Cluster, ConfigVersion, Instance, Policy
from controlplane.services.errors import NotFound

from .common import get_or_404


def clusters() -> QuerySet[Cluster]:
    return Cluster.objects.select_related("active_policy").order_by("name")


def cluster(cluster_id: int) -> Cluster:
    return get_or_404(clusters(), cluster_id, "cluster")


def instances(cluster_id: int) -> QuerySet[Instance]:
    return cluster(cluster_id).instances.order_by("name")


def instance(instance_id: int) -> Instance:
    return get_or_404(Instance.objects.all(), instance_id, "instance")


def policies(cluster_id: int) -> QuerySet[Policy]:
    return cluster(cluster_id).policies.order_by("name")


def config_versions(cluster_id: int) -> QuerySet[ConfigVersion]:
    return cluster(cluster_id).versions.order_by("-number")


def config_version(cluster_id: int, number: int) -> ConfigVersion:
    version = config_versions(cluster_id).filter(number=number).first()
    if version is None:
        raise NotFound(f"cluster {cluster_id} has no config version {number}", "number")
    return version


def current_config(cluster: Cluster) -> ConfigVersion:
    version = cluster.versions.order_by("-number").first()
    if version is None:
        raise NotFound(
            f"{cluster.name} has no config version yet: add instances and activate a policy"
        )
    return version


def pools(cluster: Cluster) -> dict[str, list[str]] | None:
    """A disaggregated cluster's instances by role (prefill, decode, both); None when every
    instance serves both halves (the cluster is not disaggregated)."""
    by_role: dict[str, list[str]] = {role: [] for role in Instance.Role.values}
    for name, role in cluster.instances.order_by("name").values_list("name", "role"):
        by_role[role].append(name)
    if len(by_role["both"]) == sum(len(names) for names in by_role.values()):
        return None
    return by_role
