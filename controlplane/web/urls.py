"""Routes of the web UI (namespace `web`)."""

from django.contrib.auth import views as auth_views
from django.urls import path

from . import (
    canaries,
    canary_detail,
    captures,
    clusters,
    credentials,
    events,
    policies,
    replays,
    tenants,
)
from .login import ThrottledAuthenticationForm

app_name = "web"

urlpatterns = [
    path("", clusters.cluster_list, name="clusters"),
    path(
        "login/",
        auth_views.LoginView.as_view(
            template_name="web/login.html",
            redirect_authenticated_user=True,
            authentication_form=ThrottledAuthenticationForm,
        ),
        name="login",
    ),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("clusters/<int:cluster_id>/", clusters.cluster_live, name="cluster"),
    path("clusters/<int:cluster_id>/snapshot.json", clusters.cluster_snapshot, name="snapshot"),
    path("clusters/<int:cluster_id>/role/", clusters.instance_role, name="instance_role"),
    path("clusters/<int:cluster_id>/decider/", clusters.cluster_decider, name="cluster_decider"),
    path(
        "clusters/<int:cluster_id>/decode-policy/",
        clusters.cluster_decode_policy,
        name="cluster_decode_policy",
    ),
    path(
        "clusters/<int:cluster_id>/grey-override/",
        clusters.instance_grey_override,
        name="instance_grey_override",
    ),
    path("clusters/<int:cluster_id>/policy/", policies.policy_page, name="policy"),
    path("clusters/<int:cluster_id>/policy/params/", policies.policy_params, name="policy_params"),
    path("clusters/<int:cluster_id>/policy/apply/", policies.policy_apply, name="policy_apply"),
    path(
        "clusters/<int:cluster_id>/session-sources/",
        policies.session_sources_set,
        name="session_sources",
    ),
    path("clusters/<int:cluster_id>/routers/", policies.router_versions, name="routers"),
    path("clusters/<int:cluster_id>/canary/", canaries.canary_page, name="canary"),
    path("clusters/<int:cluster_id>/canary/create/", canaries.canary_create, name="canary_create"),
    path(
        "clusters/<int:cluster_id>/canary/<int:canary_id>/",
        canary_detail.canary_detail,
        name="canary_detail",
    ),
    path(
        "clusters/<int:cluster_id>/canary/<int:canary_id>/comparison/",
        canaries.canary_comparison,
        name="canary_comparison",
    ),
    path(
        "clusters/<int:cluster_id>/canary/<int:canary_id>/<str:action>/",
        canaries.canary_action,
        name="canary_action",
    ),
    path("clusters/<int:cluster_id>/replays/", replays.replay_page, name="replays"),
    path("clusters/<int:cluster_id>/replays/create/", replays.replay_create, name="replay_create"),
    path(
        "clusters/<int:cluster_id>/replays/<int:job_id>/",
        replays.replay_detail,
        name="replay_detail",
    ),
    path("clusters/<int:cluster_id>/captures/", captures.captures_page, name="captures"),
    path("clusters/<int:cluster_id>/captures/start/", captures.capture_start, name="capture_start"),
    path(
        "clusters/<int:cluster_id>/captures/<int:capture_id>/download/",
        captures.capture_download,
        name="capture_download",
    ),
    path(
        "clusters/<int:cluster_id>/captures/<int:capture_id>/<str:action>/",
        captures.capture_action,
        name="capture_action",
    ),
    path("clusters/<int:cluster_id>/keys/", credentials.client_keys_page, name="client_keys"),
    path(
        "clusters/<int:cluster_id>/keys/create/",
        credentials.client_key_create,
        name="client_key_create",
    ),
    path(
        "clusters/<int:cluster_id>/keys/<int:key_id>/revoke/",
        credentials.client_key_revoke,
        name="client_key_revoke",
    ),
    path(
        "clusters/<int:cluster_id>/keys/required/",
        credentials.client_auth_set,
        name="client_auth_set",
    ),
    path("clusters/<int:cluster_id>/tenants/", tenants.tenants_page, name="tenants"),
    path("clusters/<int:cluster_id>/tenants/create/", tenants.tenant_create, name="tenant_create"),
    path("clusters/<int:cluster_id>/flow/", tenants.flow_tpot_slo, name="flow_tpot_slo"),
    path(
        "clusters/<int:cluster_id>/tenants/<int:tenant_id>/update/",
        tenants.tenant_update,
        name="tenant_update",
    ),
    path(
        "clusters/<int:cluster_id>/tenants/<int:tenant_id>/delete/",
        tenants.tenant_delete,
        name="tenant_delete",
    ),
    path(
        "clusters/<int:cluster_id>/keys/<int:key_id>/tenant/",
        tenants.key_tenant,
        name="key_tenant",
    ),
    path("tokens/", credentials.tokens_page, name="tokens"),
    path("tokens/create/", credentials.token_create, name="token_create"),
    path("tokens/<int:token_id>/revoke/", credentials.token_revoke, name="token_revoke"),
    path("hotspots/", events.hotspot_log, name="hotspots"),
    path("audit/", events.audit_log, name="audit"),
    path("telemetry/quarantine/", events.telemetry_quarantine, name="quarantine"),
]
