from __future__ import annotations

from django.db import models


class ConfigVersion(models.Model):
    """An immutable router configuration document; numbers grow monotonically per cluster."""

    cluster = models.ForeignKey("Cluster", on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    document = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.CharField(max_length=150)
    reason = models.TextField()

    class Meta:
        ordering = ["cluster", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "number"], name="config_version_per_cluster")
        ]

    def __str__(self) -> str:
        return f"{self.cluster.name} v{self.number}"

    def save(self, *args, **kwargs) -> None:
        if self.pk is not None:
            raise ValueError("config versions are immutable; create a new version instead")
        super().save(*args, **kwargs)


class RouterDeployment(models.Model):
    """A router process that should run on `host`, supervised by that host's Celery worker."""

    class Desired(models.TextChoices):
        RUNNING = "running"
        STOPPED = "stopped"

    cluster = models.ForeignKey("Cluster", on_delete=models.CASCADE, related_name="routers")
    name = models.CharField(max_length=64)
    host = models.CharField(max_length=128)
    port = models.PositiveIntegerField()
    desired_state = models.CharField(
        max_length=16, choices=Desired.choices, default=Desired.RUNNING
    )
    token_hash = models.CharField(max_length=128, blank=True, default="")
    applied_version = models.PositiveIntegerField(null=True, blank=True)
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    heartbeat = models.JSONField(default=dict, blank=True)
    restarts = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["cluster", "name"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="router_name_per_cluster"),
            models.UniqueConstraint(fields=["host", "port"], name="router_port_per_host"),
        ]

    def __str__(self) -> str:
        return f"{self.cluster.name}/{self.name}@{self.host}:{self.port}"
