"""Every user-facing endpoint once, with a request that succeeds in the conftest world."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

REASON = {"reason": "ticket OPS-42"}


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str  # formatted with the world's ids
    min_role: str
    success: int = 200
    body: dict[str, Any] | None = None
    audit_action: str | None = None  # for mutating endpoints: the one audit row they write
    updates: bool = field(default=False)  # has a `before` (changes an existing object)

    @property
    def id(self) -> str:
        return f"{self.method} {self.path}"


def canary_body() -> dict[str, Any]:
    return {
        "name": "new-canary",
        "baseline_policy_id": "{lm}",
        "candidate_policy_id": "{ll}",
        "baseline_instances": ["i0"],
        "candidate_instances": ["i1", "i2"],
        "weight_steps": [5, 25, 100],
        **REASON,
    }


READS = [
    Endpoint("GET", "/api/v1/me", "viewer"),
    Endpoint("GET", "/api/v1/clusters", "viewer"),
    Endpoint("GET", "/api/v1/clusters/{alpha}", "viewer"),
    Endpoint("GET", "/api/v1/clusters/{alpha}/instances", "viewer"),
    Endpoint("GET", "/api/v1/policy-kinds", "viewer"),
    Endpoint("GET", "/api/v1/clusters/{alpha}/policies", "viewer"),
    Endpoint("GET", "/api/v1/clusters/{alpha}/canaries", "viewer"),
    Endpoint("GET", "/api/v1/canaries/{running}", "viewer"),
    Endpoint("GET", "/api/v1/canaries/{running}/judgements", "viewer"),
    Endpoint("GET", "/api/v1/canaries/{running}/timeline", "viewer"),
    Endpoint("GET", "/api/v1/canary-defaults", "viewer"),
    Endpoint("GET", "/api/v1/clusters/{alpha}/config-versions", "viewer"),
    Endpoint("GET", "/api/v1/clusters/{alpha}/config-versions/1", "viewer"),
    Endpoint("GET", "/api/v1/routers", "viewer"),
    Endpoint("GET", "/api/v1/routers/{router}", "viewer"),
    Endpoint("GET", "/api/v1/hotspot-events?cluster={alpha}&transition=suspected", "viewer"),
    Endpoint("GET", "/api/v1/audit-events?cluster={alpha}&action=policy.activate", "viewer"),
    Endpoint("GET", "/api/v1/telemetry-quarantine?limit=5", "viewer"),
    Endpoint("GET", "/api/v1/clusters/{alpha}/rollups/arms", "viewer"),
    Endpoint("GET", "/api/v1/clusters/{alpha}/rollups/instances", "viewer"),
    Endpoint("GET", "/api/v1/clusters/{alpha}/decisions?limit=5", "viewer"),
    Endpoint("GET", "/api/v1/metrics", "viewer"),
    Endpoint("GET", "/api/v1/clusters/{alpha}/live", "viewer"),
    Endpoint("GET", "/api/v1/replays", "viewer"),
    Endpoint("GET", "/api/v1/replays/{replay}", "viewer"),
    Endpoint("GET", "/api/v1/clusters/{gamma}/captures", "viewer"),
    Endpoint("GET", "/api/v1/captures/{capture}", "viewer"),
    Endpoint("GET", "/api/v1/captures/{capture}/trace", "viewer"),
    Endpoint("GET", "/api/v1/tokens", "viewer"),
    Endpoint("GET", "/api/v1/clusters/{alpha}/client-keys", "viewer"),
    Endpoint("GET", "/api/v1/clusters/{alpha}/client-auth", "viewer"),
    Endpoint("GET", "/api/v1/clusters/{alpha}/session-sources", "viewer"),
    Endpoint("GET", "/api/v1/clusters/{alpha}/decider", "viewer"),
    Endpoint("GET", "/api/v1/clusters/{alpha}/decode-policy", "viewer"),
    Endpoint("GET", "/api/v1/clusters/{alpha}/flow", "viewer"),
    Endpoint("GET", "/api/v1/clusters/{alpha}/tenants", "viewer"),
]

WRITES = [
    Endpoint(
        "POST",
        "/api/v1/clusters",
        "admin",
        201,
        audit_action="cluster.create",
        body={"name": "delta", "model": "Qwen/Qwen3-8B", "gpu_type": "h100", **REASON},
    ),
    Endpoint(
        "POST",
        "/api/v1/clusters/{alpha}/instances",
        "admin",
        201,
        audit_action="instance.add",
        body={"name": "i9", "url": "http://127.0.0.1:9199", **REASON},
    ),
    Endpoint(
        "POST",
        "/api/v1/instances/{i0}/drain",
        "operator",
        body=REASON,
        audit_action="instance.drain",
        updates=True,
    ),
    Endpoint(
        "POST",
        "/api/v1/instances/{i0}/role",
        "operator",
        body={"role": "decode", **REASON},
        audit_action="instance.role",
        updates=True,
    ),
    Endpoint(
        "POST",
        "/api/v1/instances/{i0}/grey-override",
        "operator",
        body={"mode": "drained", **REASON},
        audit_action="instance.grey_override",
        updates=True,
    ),
    Endpoint(
        "POST",
        "/api/v1/instances/{i3}/enable",
        "operator",
        body=REASON,
        audit_action="instance.enable",
        updates=True,
    ),
    Endpoint(
        "DELETE",
        "/api/v1/instances/{spare}?reason=ticket%20OPS-42",
        "admin",
        204,
        audit_action="instance.remove",
        updates=True,
    ),
    Endpoint(
        "POST",
        "/api/v1/clusters/{alpha}/policies",
        "operator",
        201,
        audit_action="policy.create",
        body={"name": "lin", "kind": "linear", "params": {"w": 0.55}, **REASON},
    ),
    Endpoint(
        "POST",
        "/api/v1/clusters/{alpha}/policies/{ll}/activate",
        "operator",
        body=REASON,
        audit_action="policy.activate",
        updates=True,
    ),
    Endpoint(
        "POST",
        "/api/v1/clusters/{alpha}/canaries",
        "operator",
        201,
        audit_action="canary.create",
        body=canary_body(),
    ),
    Endpoint(
        "POST",
        "/api/v1/canaries/{draft}/start",
        "operator",
        body=REASON,
        audit_action="canary.start",
        updates=True,
    ),
    Endpoint(
        "POST",
        "/api/v1/canaries/{running}/pause",
        "operator",
        body=REASON,
        audit_action="canary.pause",
        updates=True,
    ),
    Endpoint(
        "POST",
        "/api/v1/canaries/{paused}/resume",
        "operator",
        body=REASON,
        audit_action="canary.resume",
        updates=True,
    ),
    Endpoint(
        "POST",
        "/api/v1/canaries/{running}/promote",
        "operator",
        body=REASON,
        audit_action="canary.promote",
        updates=True,
    ),
    Endpoint(
        "POST",
        "/api/v1/canaries/{draft}/abort",
        "operator",
        body=REASON,
        audit_action="canary.abort",
        updates=True,
    ),
    Endpoint(
        "POST",
        "/api/v1/clusters/{alpha}/routers",
        "admin",
        201,
        audit_action="router.create",
        body={"name": "r2", "host": "10.0.0.2", "port": 8200, **REASON},
    ),
    Endpoint(
        "POST",
        "/api/v1/clusters/{alpha}/replays",
        "operator",
        202,
        audit_action="replay.create",
        body={
            "trace": "shared:mooncake_synthetic_trace.jsonl",
            "policies": [{"kind": "lmetric"}, {"kind": "round_robin"}],
            **REASON,
        },
    ),
    Endpoint(
        "POST",
        "/api/v1/clusters/{alpha}/client-keys",
        "admin",
        201,
        audit_action="client_key.create",
        body={"name": "svc-a", "debug": True, **REASON},
    ),
    Endpoint(
        "POST",
        "/api/v1/clusters/{alpha}/client-keys/{client_key}/revoke",
        "admin",
        body=REASON,
        audit_action="client_key.revoke",
        updates=True,
    ),
    Endpoint(
        "POST",
        "/api/v1/clusters/{alpha}/tenants",
        "operator",
        201,
        audit_action="tenant.create",
        body={"name": "team-b", "priority": "critical", "weight": 2, **REASON},
    ),
    Endpoint(
        "PATCH",
        "/api/v1/clusters/{alpha}/tenants/{tenant}",
        "operator",
        body={"requests_per_minute": 600, **REASON},
        audit_action="tenant.update",
        updates=True,
    ),
    Endpoint(
        "DELETE",
        "/api/v1/clusters/{alpha}/tenants/{tenant}?reason=ticket%20OPS-42",
        "operator",
        204,
        audit_action="tenant.delete",
        updates=True,
    ),
    Endpoint(
        "PUT",
        "/api/v1/clusters/{alpha}/client-keys/{client_key}/tenant",
        "operator",
        body={"tenant_id": "{tenant}", **REASON},
        audit_action="client_key.tenant",
        updates=True,
    ),
    Endpoint(
        "POST",
        "/api/v1/tokens",
        "viewer",
        201,
        audit_action="api_token.create",
        body={"name": "laptop", "valid_days": 30, **REASON},
    ),
    # Your own token, or anyone's for an admin (the world's token is another user's).
    Endpoint(
        "POST",
        "/api/v1/tokens/{api_token}/revoke",
        "admin",
        body=REASON,
        audit_action="api_token.revoke",
        updates=True,
    ),
    Endpoint(
        "PUT",
        "/api/v1/clusters/{alpha}/client-auth",
        "admin",
        body={"required": True, **REASON},
        audit_action="cluster.client_keys_required",
        updates=True,
    ),
    Endpoint(
        "PUT",
        "/api/v1/clusters/{alpha}/session-sources",
        "operator",
        body={"sources": ["header", "user"], **REASON},
        audit_action="cluster.session_sources",
        updates=True,
    ),
    Endpoint(
        "PUT",
        "/api/v1/clusters/{alpha}/decider",
        "operator",
        body={"decider": "prefix_threshold", **REASON},
        audit_action="cluster.decider",
        updates=True,
    ),
    Endpoint(
        "PUT",
        "/api/v1/clusters/{alpha}/decode-policy",
        "operator",
        body={"policy_id": "{rr}", **REASON},
        audit_action="policy.decode",
        updates=True,
    ),
    Endpoint(
        "PUT",
        "/api/v1/clusters/{alpha}/flow",
        "operator",
        body={"tpot_slo_ms": 100, **REASON},
        audit_action="cluster.flow_tpot_slo",
        updates=True,
    ),
    Endpoint(
        "POST",
        "/api/v1/clusters/{alpha}/captures",
        "operator",
        201,
        audit_action="capture.start",
        body={"name": "api-capture", "max_requests": 100, **REASON},
    ),
    Endpoint(
        "POST",
        "/api/v1/captures/{capture}/stop",
        "operator",
        body=REASON,
        audit_action="capture.stop",
        updates=True,
    ),
    Endpoint(
        "PATCH",
        "/api/v1/captures/{capture}",
        "operator",
        body={"name": "renamed", **REASON},
        audit_action="capture.rename",
        updates=True,
    ),
    Endpoint(
        "DELETE",
        "/api/v1/captures/{capture}?reason=ticket%20OPS-42",
        "operator",
        204,
        audit_action="capture.delete",
        updates=True,
    ),
]

ROUTER_AGENT = [
    Endpoint("GET", "/api/v1/routers/{router}/config", "router"),
    Endpoint(
        "POST",
        "/api/v1/routers/{router}/heartbeat",
        "router",
        body={"applied_version": 1, "state": {"instances": 5}},
    ),
]

ENDPOINTS = READS + WRITES


def fill(value: Any, ids: dict[str, int]) -> Any:
    """Replace "{name}" placeholders with world ids (ints stay ints in JSON bodies)."""
    if isinstance(value, str):
        whole = value[1:-1] if value.startswith("{") and value.endswith("}") else None
        return ids[whole] if whole in ids else value.format(**ids)
    if isinstance(value, list):
        return [fill(v, ids) for v in value]
    if isinstance(value, dict):
        return {k: fill(v, ids) for k, v in value.items()}
    return value


def call(client, endpoint: Endpoint, ids: dict[str, int], **headers: str):
    path = fill(endpoint.path, ids)
    body = fill(endpoint.body, ids) if endpoint.body is not None else None
    method = getattr(client, endpoint.method.lower())
    if body is None:
        return method(path, headers=headers)
    return method(path, data=body, content_type="application/json", headers=headers)
