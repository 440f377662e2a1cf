from __future__ import annotations

from django.db import models

from router_worker.routing.flow import PRIORITIES


class Tenant(models.Model):
    """A team or customer sharing a cluster's fleet: its client keys, its priority class,
    its share and its limits. A cluster's keys without a tenant belong to its `default`
    tenant, which needs no row (a row named `default` changes its settings). The
    settings are validated with the routers' own class
    (``router_worker.routing.flow.TenantSettings``) before a row is written."""

    cluster = models.ForeignKey("Cluster", on_delete=models.CASCADE, related_name="tenants")
    name = models.CharField(max_length=64)
    priority = models.CharField(
        max_length=16, choices=[(p, p) for p in PRIORITIES], default="standard"
    )
    weight = models.FloatField(default=1.0)
    requests_per_minute = models.BigIntegerField(null=True, blank=True)
    tokens_per_minute = models.BigIntegerField(null=True, blank=True)
    token_budget = models.BigIntegerField(null=True, blank=True)
    budget_period = models.CharField(max_length=8, default="day")
    max_queued = models.PositiveIntegerField(default=256)
    max_queued_bytes = models.BigIntegerField(default=64 * 1024**2)
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.CharField(max_length=150)

    class Meta:
        ordering = ["cluster", "name"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="tenant_name_per_cluster"),
        ]

    def __str__(self) -> str:
        return f"{self.cluster.name}/{self.name}"
