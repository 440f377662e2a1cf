from __future__ import annotations

from django.db import models
from django.db.models import Q


class ClientKey(models.Model):
    """An API key for the clients of one cluster's routers. Only its sha256 is stored (and
    sent to the routers with the configuration); the key is shown once, at creation."""

    cluster = models.ForeignKey("Cluster", on_delete=models.CASCADE, related_name="client_keys")
    name = models.CharField(max_length=64)
    prefix = models.CharField(max_length=16, db_index=True)
    key_hash = models.CharField(max_length=64, unique=True)
    can_debug = models.BooleanField(
        default=False, help_text="The router honours x-switchyard-debug for this key."
    )
    tenant = models.ForeignKey(
        "Tenant",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="client_keys",
        help_text="Empty: the cluster's default tenant.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.CharField(max_length=150)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.CharField(max_length=150, blank=True, default="")

    class Meta:
        ordering = ["cluster", "-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "name"],
                condition=Q(revoked_at=None),
                name="active_client_key_name_per_cluster",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.cluster.name}/{self.name} ({self.prefix})"

    @property
    def active(self) -> bool:
        return self.revoked_at is None
