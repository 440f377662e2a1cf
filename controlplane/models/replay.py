from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class ReplayJob(models.Model):
    """A what-if replay of a trace over chosen policies on a cluster's model and GPU."""

    class State(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"

    cluster = models.ForeignKey("Cluster", on_delete=models.CASCADE, related_name="replays")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    inputs = models.JSONField(default=dict)  # trace, policies, rate_scale, limits, seed
    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED)
    progress = models.FloatField(default=0.0)
    results = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    finished_at = models.DateTimeField(null=True, blank=True)
    # Last sign of life from the worker running the job (claim, progress): a running job
    # whose worker died (killed, restarted, out of memory) is failed once this goes stale.
    heartbeat_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    # No worker took a queued job within this long: say where one is expected.
    UNCLAIMED_AFTER_S = 60

    @property
    def unclaimed(self) -> bool:
        """Queued for longer than a free ``replays`` worker would leave it."""
        age = (timezone.now() - self.created_at).total_seconds()
        return self.state == self.State.QUEUED and age > self.UNCLAIMED_AFTER_S


class ReplayCell(models.Model):
    """One policy at one load and one seed of a replay job: one Celery task of the job's
    chord (controlplane/tasks/replay.py), run by whichever ``replays`` worker takes it."""

    State = ReplayJob.State

    job = models.ForeignKey(ReplayJob, on_delete=models.CASCADE, related_name="cells")
    index = models.PositiveIntegerField()
    policy = models.PositiveIntegerField()  # its index in the job's inputs["policies"]
    rate_scale = models.FloatField()
    seed = models.IntegerField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED)
    progress = models.FloatField(default=0.0)
    attempts = models.PositiveSmallIntegerField(default=0)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    worker = models.CharField(max_length=200, blank=True, default="")  # the last to run it
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["job", "index"]
        constraints = [
            models.UniqueConstraint(fields=["job", "index"], name="one_cell_per_index"),
        ]

    @property
    def terminal(self) -> bool:
        return self.state in (self.State.SUCCEEDED, self.State.FAILED)
