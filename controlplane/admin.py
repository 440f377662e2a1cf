"""Django admin for every model. Append-only and immutable records are read-only here:
changes to desired state belong to the services (audited), not to raw admin edits."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from controlplane import models


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


@admin.register(models.Cluster)
class ClusterAdmin(admin.ModelAdmin):
    list_display = ("name", "model", "gpu_type", "block_size", "active_policy", "created_at")
    search_fields = ("name", "model")


@admin.register(models.Instance)
class InstanceAdmin(admin.ModelAdmin):
    list_display = ("name", "cluster", "url", "state", "healthy", "last_seen_at")
    list_filter = ("cluster", "state", "healthy")


@admin.register(models.Policy)
class PolicyAdmin(admin.ModelAdmin):
    list_display = ("name", "cluster", "kind", "created_at")
    list_filter = ("cluster", "kind")


@admin.register(models.CanarySplit)
class CanarySplitAdmin(admin.ModelAdmin):
    list_display = ("name", "cluster", "state", "step_index", "failures", "created_at")
    list_filter = ("cluster", "state")


@admin.register(models.RouterDeployment)
class RouterDeploymentAdmin(admin.ModelAdmin):
    list_display = ("name", "cluster", "host", "port", "desired_state", "applied_version",
                    "last_heartbeat")
    list_filter = ("cluster", "desired_state")
    exclude = ("token_hash",)


@admin.register(models.ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("name", "user", "prefix", "created_at", "last_used_at", "revoked")
    list_filter = ("revoked",)
    readonly_fields = ("user", "name", "prefix", "created_at", "last_used_at")
    exclude = ("token_hash",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # tokens are created by `manage.py create_api_token`, shown once


@admin.register(models.ReplayJob)
class ReplayJobAdmin(admin.ModelAdmin):
    list_display = ("id", "cluster", "state", "progress", "created_by", "created_at")
    list_filter = ("cluster", "state")


@admin.register(models.ArmMetricRollup)
class ArmMetricRollupAdmin(ReadOnlyAdmin):
    list_display = ("cluster", "arm", "minute", "requests", "errors", "ttft_p50_s")
    list_filter = ("cluster", "arm")


@admin.register(models.InstanceMetricRollup)
class InstanceMetricRollupAdmin(ReadOnlyAdmin):
    list_display = ("cluster", "instance", "minute", "requests", "errors", "ttft_p50_s")
    list_filter = ("cluster", "instance")


@admin.register(models.AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    list_display = ("at", "actor_name", "action", "target_type", "target_id", "cluster")
    list_filter = ("action", "cluster")
    search_fields = ("actor_name", "reason", "target_id")


@admin.register(models.HotspotEvent)
class HotspotEventAdmin(ReadOnlyAdmin):
    list_display = ("at", "cluster", "transition", "prefix_class", "m", "m_bar")
    list_filter = ("cluster", "transition")


@admin.register(models.RouterEvent)
class RouterEventAdmin(ReadOnlyAdmin):
    list_display = ("at", "cluster", "router", "kind")
    list_filter = ("cluster", "kind")


@admin.register(models.ConfigVersion)
class ConfigVersionAdmin(ReadOnlyAdmin):
    list_display = ("cluster", "number", "created_by", "created_at")
    list_filter = ("cluster",)


@admin.register(models.CanaryJudgement)
class CanaryJudgementAdmin(ReadOnlyAdmin):
    list_display = ("canary", "at", "step_index", "verdict", "action")
    list_filter = ("verdict", "action")


@admin.register(models.IngestedRecord)
class IngestedRecordAdmin(ReadOnlyAdmin):
    list_display = ("record_id", "at")
    search_fields = ("record_id",)


@admin.register(models.ClientKey)
class ClientKeyAdmin(ReadOnlyAdmin):
    """Created and revoked by the client-keys service (audited, published to routers)."""

    list_display = ("name", "cluster", "prefix", "can_debug", "created_at", "revoked_at")
    list_filter = ("cluster", "can_debug")
    exclude = ("key_hash",)
