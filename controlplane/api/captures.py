"""Traffic captures: start, stop, rename and delete one, and download its trace."""

from __future__ import annotations

from datetime import datetime

from django.http import HttpRequest, StreamingHttpResponse
from ninja import Field, Router, Schema, Status

from controlplane.models import TrafficCapture
from controlplane.selectors import captures as capture_selectors
from controlplane.services import captures as capture_services
from controlplane.services.errors import NotFound

from .auth import actor_of, role
from .schemas import Id, Name, Reason, ReasonIn

routes = Router(tags=["captures"])


class CaptureIn(Schema):
    name: Name
    max_requests: int | None = Field(None, ge=1, le=capture_services.MAX_REQUESTS)
    max_minutes: int | None = Field(None, ge=1, le=capture_services.MAX_MINUTES)
    engine_time_scale: float = Field(
        1.0, ge=0.001, le=1000, description="1 for vLLM; enginesim's --time-scale"
    )
    reason: Reason = ""


class CaptureRenameIn(Schema):
    name: Name
    reason: Reason = ""


class CaptureOut(Schema):
    id: int
    cluster_id: int
    name: str
    state: str
    requests: int
    dropped: int
    max_requests: int
    max_duration_s: int
    engine_time_scale: float
    started_at: datetime
    stopped_at: datetime | None
    stop_reason: str
    trace: str = Field(description="How a replay names it (`trace` of POST .../replays).")


def _capture(capture_id: int) -> TrafficCapture:
    capture = TrafficCapture.objects.filter(pk=capture_id).defer("salt").first()
    if capture is None:
        raise NotFound(f"capture {capture_id} does not exist")
    return capture


@routes.get("/clusters/{cluster_id}/captures", response=list[CaptureOut])
def list_captures(request: HttpRequest, cluster_id: Id):
    return capture_selectors.captures(cluster_id)


@routes.post("/clusters/{cluster_id}/captures", response={201: CaptureOut}, auth=role("operator"))
def start_capture(request: HttpRequest, cluster_id: Id, payload: CaptureIn):
    capture = capture_services.start_capture(actor_of(request), cluster_id, **payload.dict())
    return Status(201, capture)


@routes.get("/captures/{capture_id}", response=CaptureOut)
def get_capture(request: HttpRequest, capture_id: Id):
    return _capture(capture_id)


@routes.post("/captures/{capture_id}/stop", response=CaptureOut, auth=role("operator"))
def stop_capture(request: HttpRequest, capture_id: Id, payload: ReasonIn):
    capture = _capture(capture_id)
    capture_services.stop_capture(
        actor_of(request), capture.cluster_id, capture_id, reason=payload.reason
    )
    return _capture(capture_id)


@routes.patch("/captures/{capture_id}", response=CaptureOut, auth=role("operator"))
def rename_capture(request: HttpRequest, capture_id: Id, payload: CaptureRenameIn):
    capture = _capture(capture_id)
    return capture_services.rename_capture(
        actor_of(request), capture.cluster_id, capture_id, **payload.dict()
    )


@routes.delete("/captures/{capture_id}", response={204: None}, auth=role("operator"))
def delete_capture(request: HttpRequest, capture_id: Id, reason: Reason = ""):
    capture = _capture(capture_id)
    capture_services.delete_capture(
        actor_of(request), capture.cluster_id, capture_id, reason=reason
    )
    return Status(204, None)


@routes.get("/captures/{capture_id}/trace", response={200: None})
def capture_trace(request: HttpRequest, capture_id: Id):
    """The capture as Bailian-form JSONL (what the Capture tab's Download gives)."""
    capture = _capture(capture_id)
    response = StreamingHttpResponse(
        capture_services.download(actor_of(request), capture),
        content_type="application/x-ndjson",
    )
    response["Content-Disposition"] = f'attachment; filename="capture-{capture.pk}.jsonl"'
    return response
