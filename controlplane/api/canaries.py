"""Canary splits and their rollout."""

from typing import Literal

from django.http import HttpRequest
from ninja import Router, Status
from ninja.pagination import paginate

from controlplane.selectors import canaries as canary_selectors
from controlplane.services import canaries as canary_services
from controlplane.services import guardrails

from .auth import actor_of, role
from .pagination import Pages
from .revisions import expected_revision
from .schemas import (
    CanaryDefaultsOut,
    CanaryDetailOut,
    CanaryIn,
    CanaryOut,
    Id,
    JudgementOut,
    ReasonIn,
    TimelineRowOut,
)

routes = Router(tags=["canaries"])
CanaryState = Literal["draft", "progressing", "paused", "promoted", "rolled_back", "aborted"]


@routes.get("/clusters/{cluster_id}/canaries", response=list[CanaryOut])
def list_canaries(request: HttpRequest, cluster_id: Id, state: CanaryState | None = None):
    return canary_selectors.canaries(cluster_id, state)


@routes.get("/canary-defaults", response=CanaryDefaultsOut)
def canary_defaults(request: HttpRequest):
    """What a canary created without weight steps or some guardrails gets, on this deployment
    (``SWITCHYARD_CANARY_DEFAULTS`` overrides the built-in values)."""
    defaults = canary_services.site_defaults()
    return {
        "weight_steps": defaults.weight_steps,
        "guardrails": {
            key: {"default": value, **guardrails.rules(key)}
            for key, value in defaults.guardrails.model_dump().items()
        },
    }


@routes.get("/canaries/{canary_id}", response=CanaryDetailOut)
def get_canary(request: HttpRequest, canary_id: Id):
    return canary_selectors.canary(canary_id)


@routes.get("/canaries/{canary_id}/judgements", response=list[JudgementOut])
@paginate(Pages)
def list_judgements(request: HttpRequest, canary_id: Id):
    """Every judgement of the canary judge on this canary, oldest first, with its evidence."""
    return canary_selectors.judgements(canary_id)


@routes.get("/canaries/{canary_id}/timeline", response=list[TimelineRowOut])
@paginate(Pages)
def canary_timeline(request: HttpRequest, canary_id: Id):
    """The judgements oldest first, with each run of repeats (a step halted while samples
    accumulate) collapsed into one row with its count and time span (read from the
    database a chunk at a time: only the collapsed rows are held)."""
    return [
        {
            "first_id": row.first.pk,
            "last_id": row.last.pk,
            "first_at": row.first.at,
            "last_at": row.last.at,
            "count": row.count,
            "step_index": row.last.step_index,
            "verdict": row.last.verdict,
            "action": row.last.action,
            "evidence": row.last.evidence,
        }
        for row in canary_selectors.timeline(
            canary_selectors.judgements(canary_id).iterator(chunk_size=500)
        )
    ]


@routes.post("/clusters/{cluster_id}/canaries", response={201: CanaryOut}, auth=role("operator"))
def create_canary(request: HttpRequest, cluster_id: Id, payload: CanaryIn):
    canary = canary_services.create_canary(actor_of(request), cluster_id, **payload.dict())
    return Status(201, canary)


def _transition_endpoint(action: str) -> None:
    def transition(request: HttpRequest, canary_id: Id, payload: ReasonIn):
        return canary_services.transition(
            actor_of(request),
            canary_id,
            action,
            reason=payload.reason,
            expected_revision=expected_revision(request, payload.expected_revision),
        )

    transition.__name__ = f"{action}_canary"
    routes.post(
        f"/canaries/{{canary_id}}/{action}",
        response=CanaryOut,
        auth=role("operator"),
        summary=f"{action.capitalize()} a canary",
    )(transition)


for _action in ("start", "pause", "resume", "promote", "abort"):
    _transition_endpoint(_action)
