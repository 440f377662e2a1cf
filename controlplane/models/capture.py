from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q


class TrafficCapture(models.Model):
    """A recording of a cluster's own traffic as a replayable trace (one at a time per
    cluster). Its routers send every finished request, without its text, while it runs
    (router_worker/capture.py); it stops when an operator stops it or at its limits."""

    class State(models.TextChoices):
        CAPTURING = "capturing"
        STOPPED = "stopped"

    cluster = models.ForeignKey("Cluster", on_delete=models.CASCADE, related_name="captures")
    name = models.CharField(max_length=100)
    state = models.CharField(max_length=16, choices=State.choices, default=State.CAPTURING)
    # the key of the routers' digests: never shown, never leaves the control plane but in
    # the routers' configuration
    salt = models.CharField(max_length=64)
    max_requests = models.PositiveIntegerField()
    max_duration_s = models.PositiveIntegerField()
    # wall seconds per engine second: 1 for real engines, enginesim's --time-scale for a
    # simulated cluster; the export is in the engines' own time, as a replay simulates it
    engine_time_scale = models.FloatField(default=1.0)
    # the engines' context length as the routers scraped it: its replays use it
    max_model_len = models.PositiveIntegerField(null=True, blank=True)
    requests = models.PositiveIntegerField(default=0)  # stored so far
    dropped = models.PositiveIntegerField(default=0)  # past max_requests or after the stop
    started_at = models.DateTimeField(auto_now_add=True)
    started_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    stopped_at = models.DateTimeField(null=True, blank=True)
    stop_reason = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        ordering = ["-started_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["cluster"],
                condition=Q(state="capturing"),
                name="one_capture_running_per_cluster",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.cluster.name}/{self.name}"

    @property
    def capturing(self) -> bool:
        return self.state == self.State.CAPTURING

    @property
    def trace(self) -> str:
        """How a replay names it."""
        return f"capture:{self.pk}"

    @property
    def max_minutes(self) -> int:
        return self.max_duration_s // 60


class CapturedRequest(models.Model):
    """One request of a capture, as a router recorded it (router_worker.contract.telemetry
    .CapturedRequest): lengths, keyed digests and what the router measured."""

    capture = models.ForeignKey(TrafficCapture, on_delete=models.CASCADE, related_name="rows")
    batch = models.CharField(max_length=64)  # the router's batch id: ingest is idempotent
    router = models.CharField(max_length=64)
    at = models.FloatField()  # unix seconds of arrival
    prompt_tokens = models.PositiveIntegerField()
    output_tokens = models.PositiveIntegerField()
    block_size = models.PositiveIntegerField()
    hash_ids = ArrayField(models.BigIntegerField(), default=list)
    session = models.CharField(max_length=32, null=True, blank=True)
    turn = models.PositiveIntegerField(null=True, blank=True)
    # its tenant as the capture's keyed digest (`default` as it is) and its class
    tenant = models.CharField(max_length=32, null=True, blank=True)
    priority = models.CharField(max_length=16, null=True, blank=True)
    instance = models.CharField(max_length=64, blank=True, default="")
    arm = models.CharField(max_length=64, blank=True, default="")
    # the router config version it was routed under: with ``arm``, the policy that served
    # it (null from routers older than the field)
    config_version = models.PositiveIntegerField(null=True, blank=True)
    status = models.PositiveSmallIntegerField(default=0)
    ttft_s = models.FloatField(null=True, blank=True)
    tpot_s = models.FloatField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["capture", "at"]), models.Index(fields=["batch"])]
