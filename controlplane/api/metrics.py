"""Per-minute metric rollups of a cluster, per canary arm and per instance."""

from django.http import HttpRequest
from ninja import Query, Router
from ninja.pagination import paginate

from controlplane.selectors import metrics as metric_selectors

from .pagination import Pages
from .schemas import ArmRollupFilters, ArmRollupOut, Id, InstanceRollupFilters, InstanceRollupOut

routes = Router(tags=["metrics"])


@routes.get("/clusters/{cluster_id}/rollups/arms", response=list[ArmRollupOut])
@paginate(Pages)
def list_arm_rollups(request: HttpRequest, cluster_id: Id, filters: Query[ArmRollupFilters]):
    return metric_selectors.arm_rollups(
        cluster_id, since=filters.since, until=filters.until, arm=filters.arm
    )


@routes.get("/clusters/{cluster_id}/rollups/instances", response=list[InstanceRollupOut])
@paginate(Pages)
def list_instance_rollups(
    request: HttpRequest, cluster_id: Id, filters: Query[InstanceRollupFilters]
):
    return metric_selectors.instance_rollups(
        cluster_id, since=filters.since, until=filters.until, instance=filters.instance
    )
