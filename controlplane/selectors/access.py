"""Client keys of a cluster (hashes never leave the database through here)."""

from __future__ import annotations

from django.db.models import QuerySet

from controlplane.models import ClientKey

from .clusters import cluster


def client_keys(cluster_id: int) -> QuerySet[ClientKey]:
    """Active keys first, then revoked ones; newest first within each."""
    return (
        cluster(cluster_id)
        .client_keys.select_related("tenant")
        .order_by("-revoked_at", "-created_at", "-id")
        .defer("key_hash")
    )
