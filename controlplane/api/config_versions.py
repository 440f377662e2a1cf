"""Config versions: the immutable router documents of a cluster, newest first."""

from typing import Annotated

from django.http import HttpRequest
from ninja import Field, Router

from controlplane.selectors import clusters as cluster_selectors

from .schemas import ConfigVersionOut, Id

routes = Router(tags=["config versions"])
VersionNumber = Annotated[int, Field(ge=1, le=2**31 - 1)]


@routes.get("/clusters/{cluster_id}/config-versions", response=list[ConfigVersionOut])
def list_config_versions(request: HttpRequest, cluster_id: Id):
    return cluster_selectors.config_versions(cluster_id)


@routes.get("/clusters/{cluster_id}/config-versions/{number}", response=ConfigVersionOut)
def get_config_version(request: HttpRequest, cluster_id: Id, number: VersionNumber):
    return cluster_selectors.config_version(cluster_id, number)
