"""Django admin: a read-only window on every control-plane model.

Every model here is owned by a service (controlplane.services), which validates a change,
writes its audit row and publishes the new configuration to the routers in one go. A raw
admin save would skip all three, so the admin can look but not add, change or delete;
changes go through the UI, the API or `manage.py` commands. Users and groups stay editable
(roles are group memberships), and every change of a user's access made here (groups,
superuser, staff, active; created, deleted) or of a role group is audited.
The few admin actions that change state (drain or enable instances) call the services, as
the UI and the API do.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group
from django.db.models import QuerySet
from django.forms import ModelForm
from django.http import HttpRequest

from controlplane import models
from controlplane.services import accounts, clusters, config
from controlplane.services.audit import Actor
from controlplane.services.errors import ServiceError
from controlplane.services.roles import has_role


class ServiceOwnedAdmin(admin.ModelAdmin):
    """Viewable, never written: the owning service is the only writer."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(models.Cluster)
class ClusterAdmin(ServiceOwnedAdmin):
    list_display = ("name", "model", "gpu_type", "block_size", "active_policy", "created_at")
    search_fields = ("name", "model")


def _set_state(request: HttpRequest, instances: QuerySet, state: str) -> None:
    if not has_role(request.user, "operator"):
        messages.error(request, "draining or enabling instances needs the operator role")
        return
    for instance in instances:
        try:
            clusters.set_instance_state(
                Actor.of(request.user), instance.pk, state, reason="from the Django admin"
            )
        except ServiceError as error:
            messages.error(request, f"{instance}: {error.message}")
        else:
            messages.success(request, f"{instance}: {state}")


@admin.register(models.Instance)
class InstanceAdmin(ServiceOwnedAdmin):
    list_display = ("name", "cluster", "url", "state", "healthy", "last_seen_at")
    list_filter = ("cluster", "state", "healthy")
    actions = ("drain", "enable")

    @admin.action(description="Drain the selected instances (audited, published)")
    def drain(self, request: HttpRequest, queryset: QuerySet) -> None:
        _set_state(request, queryset, models.Instance.State.DRAINING)

    @admin.action(description="Enable the selected instances (audited, published)")
    def enable(self, request: HttpRequest, queryset: QuerySet) -> None:
        _set_state(request, queryset, models.Instance.State.ENABLED)


@admin.register(models.Policy)
class PolicyAdmin(ServiceOwnedAdmin):
    list_display = ("name", "cluster", "kind", "created_at")
    list_filter = ("cluster", "kind")


@admin.register(models.CanarySplit)
class CanarySplitAdmin(ServiceOwnedAdmin):
    list_display = ("name", "cluster", "state", "step_index", "failures", "created_at")
    list_filter = ("cluster", "state")


@admin.register(models.RouterDeployment)
class RouterDeploymentAdmin(ServiceOwnedAdmin):
    list_display = (
        "name",
        "cluster",
        "host",
        "port",
        "desired_state",
        "applied_version",
        "last_heartbeat",
    )
    list_filter = ("cluster", "desired_state")
    exclude = ("token_hash",)


@admin.register(models.ApiToken)
class ApiTokenAdmin(ServiceOwnedAdmin):
    list_display = ("name", "user", "prefix", "created_at", "last_used_at", "revoked")
    list_filter = ("revoked",)
    exclude = ("token_hash",)


@admin.register(models.ReplayJob)
class ReplayJobAdmin(ServiceOwnedAdmin):
    list_display = ("id", "cluster", "state", "progress", "created_by", "created_at")
    list_filter = ("cluster", "state")


@admin.register(models.ReplayCell)
class ReplayCellAdmin(ServiceOwnedAdmin):
    list_display = ("job", "index", "policy", "rate_scale", "seed", "state", "attempts")
    list_filter = ("state",)


@admin.register(models.TrafficCapture)
class TrafficCaptureAdmin(ServiceOwnedAdmin):
    """Started, stopped and deleted by the captures service (audited, published to routers)."""

    list_display = ("name", "cluster", "state", "requests", "started_at", "stopped_at")
    list_filter = ("cluster", "state")
    exclude = ("salt",)


@admin.register(models.CapturedRequest)
class CapturedRequestAdmin(ServiceOwnedAdmin):
    list_display = ("capture", "router", "at", "prompt_tokens", "output_tokens", "instance")
    list_filter = ("capture",)


@admin.register(models.ArmMetricRollup)
class ArmMetricRollupAdmin(ServiceOwnedAdmin):
    list_display = ("cluster", "arm", "minute", "requests", "errors", "ttft_p50_s")
    list_filter = ("cluster", "arm")


@admin.register(models.InstanceMetricRollup)
class InstanceMetricRollupAdmin(ServiceOwnedAdmin):
    list_display = ("cluster", "instance", "minute", "requests", "errors", "ttft_p50_s")
    list_filter = ("cluster", "instance")


@admin.register(models.AuditEvent)
class AuditEventAdmin(ServiceOwnedAdmin):
    list_display = ("at", "actor_name", "action", "target_type", "target_id", "cluster")
    list_filter = ("action", "cluster")
    search_fields = ("actor_name", "reason", "target_id")


@admin.register(models.HotspotEvent)
class HotspotEventAdmin(ServiceOwnedAdmin):
    list_display = ("at", "cluster", "transition", "prefix_class", "m", "m_bar")
    list_filter = ("cluster", "transition")


@admin.register(models.RouterEvent)
class RouterEventAdmin(ServiceOwnedAdmin):
    list_display = ("at", "cluster", "router", "kind")
    list_filter = ("cluster", "kind")


@admin.register(models.ConfigVersion)
class ConfigVersionAdmin(ServiceOwnedAdmin):
    """The document as the API shows it: no canary salt, no capture digest key."""

    list_display = ("cluster", "number", "created_by", "created_at")
    list_filter = ("cluster",)
    exclude = ("document",)
    readonly_fields = ("shown_document",)

    @admin.display(description="document (salts hidden)")
    def shown_document(self, version: models.ConfigVersion) -> str:
        return json.dumps(config.without_secrets(version.document), indent=2, sort_keys=True)


@admin.register(models.CanaryJudgement)
class CanaryJudgementAdmin(ServiceOwnedAdmin):
    list_display = ("canary", "at", "step_index", "verdict", "action")
    list_filter = ("verdict", "action")


@admin.register(models.IngestedRecord)
class IngestedRecordAdmin(ServiceOwnedAdmin):
    list_display = ("record_id", "at")
    search_fields = ("record_id",)


@admin.register(models.ClientKey)
class ClientKeyAdmin(ServiceOwnedAdmin):
    """Created and revoked by the client-keys service (audited, published to routers)."""

    list_display = ("name", "cluster", "prefix", "can_debug", "created_at", "revoked_at")
    list_filter = ("cluster", "can_debug")
    exclude = ("key_hash",)


@admin.register(models.Tenant)
class TenantAdmin(ServiceOwnedAdmin):
    """Created, changed and removed by the tenants service (audited, published to routers)."""

    list_display = ("name", "cluster", "priority", "weight", "requests_per_minute", "created_at")
    list_filter = ("cluster", "priority")


class AuditedUserAdmin(UserAdmin):
    """Django's user admin, with an audit row for each change of a user's access."""

    def save_model(self, request: HttpRequest, obj: Any, form: ModelForm, change: bool) -> None:
        # groups are saved after the user (save_related): compare once both are stored
        form.access_before = accounts.stored_access(obj.pk) if change else None  # type: ignore[attr-defined]  # read back in save_related
        super().save_model(request, obj, form, change)

    def save_related(
        self, request: HttpRequest, form: ModelForm, formsets: Any, change: bool
    ) -> None:
        super().save_related(request, form, formsets, change)
        before = getattr(form, "access_before", None)
        accounts.record_user_change(Actor.of(request.user), form.instance, before)

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        accounts.record_user_deleted(Actor.of(request.user), obj)
        super().delete_model(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet) -> None:
        for user in queryset:
            accounts.record_user_deleted(Actor.of(request.user), user)
        super().delete_queryset(request, queryset)


class AuditedGroupAdmin(GroupAdmin):
    """Renaming, creating or deleting a group named like a role changes its members' role."""

    def save_model(self, request: HttpRequest, obj: Any, form: ModelForm, change: bool) -> None:
        before = Group.objects.filter(pk=obj.pk).values_list("name", flat=True).first()
        super().save_model(request, obj, form, change)
        accounts.record_group_change(Actor.of(request.user), obj, before)

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        accounts.record_group_change(Actor.of(request.user), obj, obj.name, deleted=True)
        super().delete_model(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet) -> None:
        for group in queryset:
            accounts.record_group_change(Actor.of(request.user), group, group.name, deleted=True)
        super().delete_queryset(request, queryset)


for _model, _admin in ((get_user_model(), AuditedUserAdmin), (Group, AuditedGroupAdmin)):
    if admin.site.is_registered(_model):
        admin.site.unregister(_model)
    admin.site.register(_model, _admin)
