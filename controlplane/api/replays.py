"""What-if replay jobs: their results, the recommendation their page gives, their cells."""

from typing import Literal

from django.http import HttpRequest
from ninja import Router, Status

from controlplane.selectors import replays as replay_selectors
from controlplane.services import replays as replay_services

from .auth import actor_of, role
from .schemas import Id, ReplayCreatedOut, ReplayDetailOut, ReplayIn, ReplayOut

routes = Router(tags=["replays"])
ReplayState = Literal["queued", "running", "succeeded", "failed"]


@routes.get("/replays", response=list[ReplayOut])
def list_replays(request: HttpRequest, cluster: Id | None = None, state: ReplayState | None = None):
    return replay_selectors.replays(cluster, state)


@routes.get("/replays/{replay_id}", response=ReplayDetailOut)
def get_replay(request: HttpRequest, replay_id: Id):
    return replay_selectors.replay(replay_id)


@routes.post(
    "/clusters/{cluster_id}/replays", response={202: ReplayCreatedOut}, auth=role("operator")
)
def create_replay(request: HttpRequest, cluster_id: Id, payload: ReplayIn):
    data = payload.dict()
    outcome = replay_services.request_replay(actor_of(request), cluster_id, **data)
    return Status(
        202, {"replay": outcome.job, "dispatched": outcome.dispatched, "message": outcome.message}
    )
