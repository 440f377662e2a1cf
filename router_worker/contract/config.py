"""The router's configuration document: what the control plane stores as a ConfigVersion
and what `python -m router_worker --config FILE.json` reads.

One schema, validated with pydantic, used on both sides: the control plane refuses a
document the router would refuse, with a message naming the field. Policy parameters are
validated with each policy's own parameter class (router_worker.routing.policies).

Minimal form::

    {"instances": [{"name": "i0", "url": "http://127.0.0.1:9100"}],
     "policy": {"kind": "lmetric", "params": {}}}
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from chat_templates import BUILTIN_TEMPLATES, DEFAULT_TEMPLATE, is_builtin, template_for_model
from router_worker.routing.disagg import DeciderParams, Role
from router_worker.routing.flow import DEFAULT_TENANT, FlowParams, TenantSettings
from router_worker.routing.grey import GreyParams
from router_worker.routing.sessions import SESSION_SOURCES, SessionSource

INSTANCE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
WEIGHT_TOTAL = 100


class ConfigError(ValueError):
    """A configuration document was refused; the message names the offending field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class InstanceSpec(_Strict):
    name: str = Field(description="Unique name of the engine instance within the cluster.")
    url: str = Field(description="Base URL of the vLLM-compatible server, e.g. http://host:8000")
    state: Literal["enabled", "draining", "down"] = "enabled"
    grey_override: Literal["auto", "healthy", "drained"] = Field(
        default="auto",
        description="The operator's word on grey-failure detection for this instance: "
        "auto (the detector decides), healthy (never flagged slow), drained (no traffic, "
        "no probes, until set back).",
    )
    kv_events: str | None = Field(
        default=None, description="ZMQ endpoint of the engine's KV events publisher, if any."
    )
    kv_replay: str | None = Field(
        default=None,
        description="ZMQ endpoint of the engine's KV events replay socket (gap recovery).",
    )
    role: Role = Field(
        default="both",
        description="Prefill/decode disaggregation: prefill, decode, or both (serves either "
        "half, and whole requests).",
    )

    @field_validator("name")
    @classmethod
    def _name_is_simple(cls, value: str) -> str:
        if not INSTANCE_NAME.match(value):
            raise ValueError("use 1-64 letters, digits, '.', '_' or '-', starting alphanumeric")
        return value

    @field_validator("url")
    @classmethod
    def _url_is_http(cls, value: str) -> str:
        if not re.match(r"^https?://[^/\s]+", value):
            raise ValueError("must be an http:// or https:// URL with a host")
        return value.rstrip("/")


class PolicySpec(_Strict):
    kind: str = Field(description="Policy kind, e.g. lmetric, round_robin.")
    params: dict[str, Any] = Field(default_factory=dict)
    seed: int = 0

    @model_validator(mode="after")
    def _params_valid_for_kind(self) -> PolicySpec:
        from router_worker.routing.policies import REGISTRY

        policy_class = REGISTRY.get(self.kind)
        if policy_class is None:
            raise ValueError(f"unknown policy kind {self.kind!r}; known: {sorted(REGISTRY)}")
        policy_class.Params.model_validate(self.params)
        return self


DEFAULT_DECODE_POLICY = "decode_room"  # the decode stage's policy unless one is chosen


class DisaggregationSpec(_Strict):
    """How a cluster with prefill and decode instances routes (router_worker.routing.disagg):
    the decode stage's policy (the prefill stage and colocated requests take the arm's
    policy) and the decider."""

    decode_policy: PolicySpec = Field(
        default_factory=lambda: PolicySpec(kind=DEFAULT_DECODE_POLICY),
        description="The decode stage's policy.",
    )
    decider: DeciderParams = Field(default_factory=DeciderParams)


class ArmSpec(_Strict):
    name: str
    policy: PolicySpec
    decode_policy: PolicySpec | None = Field(
        default=None,
        description="A disaggregated cluster's decode-stage policy in this arm (a canary of "
        "the decode stage); unset: the cluster's (disaggregation.decode_policy).",
    )
    weight: float = Field(ge=0, le=WEIGHT_TOTAL, description="Share of traffic, in percent.")
    instances: list[str] = Field(min_length=1, description="Names of the arm's instances.")


class CanarySpec(_Strict):
    id: int | None = None
    arms: list[ArmSpec] = Field(min_length=2, max_length=2)
    assignment_key: Literal["session", "random"] = "session"
    salt: str = Field(
        default="",
        max_length=256,
        description="Secret mixed into the session hash that picks a session's arm, so a "
        "client cannot pick its arm by picking its session key. The control plane sets "
        "one per canary; empty: a random one per router process (routers sharing a fleet "
        "then assign sessions differently).",
    )

    @model_validator(mode="after")
    def _arms_consistent(self) -> CanarySpec:
        total = sum(arm.weight for arm in self.arms)
        if abs(total - WEIGHT_TOTAL) > 1e-9:
            raise ValueError(f"arms.weight must sum to {WEIGHT_TOTAL}, got {total:g}")
        names = [arm.name for arm in self.arms]
        if len(set(names)) != len(names):
            raise ValueError("arms.name must be unique")
        seen: dict[str, str] = {}
        for arm in self.arms:
            for instance in arm.instances:
                if instance in seen:
                    raise ValueError(
                        f"arms.instances overlap: {instance!r} is in both "
                        f"{seen[instance]!r} and {arm.name!r}"
                    )
                seen[instance] = arm.name
        return self


class RouterSettings(_Strict):
    """Router-process knobs that travel with the configuration (all optional)."""

    scrape_interval_s: float = Field(default=1.0, gt=0, le=60)
    health_interval_s: float = Field(default=0.5, gt=0, le=60)
    health_timeout_s: float = Field(
        default=0.5,
        gt=0,
        le=60,
        description="A /health probe unanswered this long counts as a failure (a hang).",
    )
    connect_timeout_s: float = Field(default=2.0, gt=0, le=60)
    first_byte_timeout_s: float = Field(
        default=120.0, gt=0, le=3600, description="Upstream silence before a retry."
    )
    max_attempts: int = Field(default=3, ge=1, le=10, description="Upstream tries per request.")
    max_continuations: int = Field(
        default=2,
        ge=0,
        le=10,
        description="Times a streamed answer an instance broke off after its first byte "
        "(connection cut, garbage, error event, silence past first_byte_timeout_s) is "
        "continued on another instance, the text already sent re-sent as prompt, so the "
        "client sees one answer. 0: such a stream ends with an SSE error event.",
    )
    max_concurrency: int = Field(default=1024, ge=1, le=100_000)
    max_queue: int = Field(default=1024, ge=0, le=100_000)
    queue_timeout_s: float = Field(default=10.0, gt=0, le=600)
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024, le=1024**3)
    # Resource limits: each hit is answered with an OpenAI-style error (or ends a
    # stream with an SSE error event and [DONE]) and counted in
    # switchyard_router_limit_hits_total{limit}.
    header_timeout_s: float = Field(
        default=15.0,
        gt=0,
        le=600,
        description="A client must send a request's head within this long of connecting "
        "(or of its first byte on a kept-alive connection), else 408 and the "
        "connection is closed (slowloris).",
    )
    body_timeout_s: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="Total time to receive a request body once its head is in, else 408 "
        "and the connection is closed (a total deadline: dripping bytes does "
        "not extend it).",
    )
    max_connections: int = Field(
        default=4096,
        ge=1,
        le=1_000_000,
        description="Open client connections; a connection beyond the cap is answered 503 "
        "and closed. Never more than half the process's file-descriptor limit "
        "(the other half is for upstream connections).",
    )
    max_response_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=1024,
        le=4 * 1024**3,
        description="Largest non-streamed engine answer read into memory; larger: 502.",
    )
    max_response_header_bytes: int = Field(
        default=64 * 1024,
        ge=1024,
        le=16 * 1024**2,
        description="Largest engine response head (all header names and values).",
    )
    max_event_bytes: int = Field(
        default=4 * 1024 * 1024,
        ge=1024,
        le=1024**3,
        description="Largest single SSE event of a streamed engine answer.",
    )
    response_deadline_s: float = Field(
        default=3600.0,
        gt=0,
        le=7 * 24 * 3600,
        description="Total time an engine answer may take, from dispatch to its last byte, "
        "however steadily it drips; then 504 (or an SSE error event mid-stream). "
        "Generous on purpose: long generations at normal speed are legitimate "
        "(32k tokens at 10 tokens/s take under an hour); the per-chunk "
        "first_byte_timeout_s catches a silent engine, this catches a dripping "
        "one. Never below first_byte_timeout_s.",
    )
    offload_body_bytes: int = Field(
        default=64 * 1024,
        ge=0,
        le=1024**3,
        description="Bodies this large or larger are parsed and tokenized in a worker "
        "process, off the event loop (0: every body).",
    )
    max_intake_queue: int = Field(
        default=1024,
        ge=1,
        le=100_000,
        description="Bodies of at least offload_body_bytes waiting for (or in) a worker "
        "process; one more is answered 429 at once.",
    )
    max_intake_queue_bytes: int = Field(
        default=128 * 1024 * 1024,
        ge=0,
        le=64 * 1024**3,
        description="Total size of those bodies; a body that would take it past this is "
        "answered 429 at once (a body is always taken when none waits). Bodies of clients "
        "that went away are dropped from the queue unread.",
    )
    grey: GreyParams = Field(
        default_factory=GreyParams,
        description="Grey-failure detection: instances alive but slower than their own "
        "normal, beyond the fleet's drift, are given less traffic, then drained, probed "
        "and restored.",
    )
    breaker_failures: int = Field(
        default=3, ge=1, le=100, description="Consecutive failures that open the circuit."
    )
    breaker_open_s: float = Field(
        default=2.0, gt=0, le=600, description="Time an open circuit waits before a probe."
    )
    tokenizer_path: str | None = Field(
        default=None, description="Local tokenizer.json (HF tokenizers) for exact tokenization."
    )
    chat_template: str = Field(
        default=DEFAULT_TEMPLATE,
        min_length=1,
        max_length=4096,
        description="The model's chat template: a built-in (chatml: Qwen's; llama3; plain) "
        "or the path, on the router host, of the model's tokenizer_config.json (its "
        "chat_template and special tokens) or of a .jinja file. Chat requests are "
        "rendered with it exactly as vLLM does. Unset (or null): the built-in of the "
        "config's `model` family (llama3 for Llama 3 models such as "
        "meta-llama/Llama-3.1-8B-Instruct, chatml for Qwen's), chatml for any other "
        "model or without one. A value set here always wins.",
    )
    kv_events: bool = Field(default=True, description="Subscribe to instances' KV events.")
    response_chains: int = Field(
        default=4096,
        ge=1,
        le=1_000_000,
        description="Responses answers remembered (LRU), so that a request naming a "
        "previous_response_id is routed as its chain's next turn: its session and the "
        "history's blocks (a reference to the prompt's block hashes the router already "
        "holds: about 40 bytes a block).",
    )
    # Replica sync (router_worker/peers.py): several routers on one fleet share their
    # dispatches over Redis pub/sub. Does nothing without a Redis URL or without peers.
    peer_sync: bool = Field(
        default=True,
        description="Publish this router's dispatches, first tokens and ends on the Redis "
        "channel switchyard:peers:{cluster} and apply other routers' to the "
        "indicators (needs --redis-url; a single router publishes ~3 small "
        "messages per request that nobody reads).",
    )
    peer_timeout_s: float = Field(
        default=5.0,
        gt=0,
        le=600,
        description="A peer router silent this long (no heartbeat) has its requests dropped "
        "from the indicators. Peers send a heartbeat every second: keep this a few seconds, "
        "or one late heartbeat drops a live peer.",
    )
    peer_max_age_s: float = Field(
        default=900.0,
        gt=0,
        le=7 * 24 * 3600,
        description="A peer's request still open after this long is dropped (a lost end "
        "message costs at most this).",
    )

    @field_validator("chat_template")
    @classmethod
    def _template_name_or_path(cls, value: str) -> str:
        if is_builtin(value) or value.endswith((".json", ".jinja")):
            return value
        raise ValueError(
            f"must be one of {', '.join(BUILTIN_TEMPLATES)} or the path of a "
            f"tokenizer_config.json or .jinja file, not {value!r}"
        )

    @model_validator(mode="after")
    def _deadline_covers_first_byte(self) -> RouterSettings:
        if self.response_deadline_s < self.first_byte_timeout_s:
            raise ValueError(
                f"response_deadline_s ({self.response_deadline_s:g}) must be at least "
                f"first_byte_timeout_s ({self.first_byte_timeout_s:g})"
            )
        return self


CLIENT_KEY_RIGHTS = ("debug",)


class ClientKeySpec(_Strict):
    """A client API key as the router knows it: its hash, never the key itself."""

    sha256: str = Field(
        pattern=r"^[0-9a-f]{64}$",
        description="sha256 (hex) of the key the client sends as a bearer token.",
    )
    rights: list[Literal["debug"]] = Field(
        default_factory=list,
        description="debug: the x-switchyard-debug header is honoured (scores, cached tokens).",
    )
    tenant: str = Field(
        default=DEFAULT_TENANT,
        max_length=64,
        description="The tenant the key belongs to (one of `tenants`, or `default`).",
    )


class ClientAuthSpec(_Strict):
    """Who may use the router. Without `required`, anyone may, but only a key with the
    debug right gets debug headers."""

    required: bool = Field(default=False, description="Refuse requests without a valid key.")
    keys: list[ClientKeySpec] = Field(default_factory=list, max_length=100_000)


class CaptureSpec(_Strict):
    """A traffic capture in progress: the routers record every finished request
    (router_worker/capture.py) until a config version without it. Each request is recorded
    with the number of the config version it was routed under (:attr:`config_version`,
    stamped by :class:`RouterConfig`), so the control plane knows which policy served it."""

    id: int = Field(ge=1, description="The capture's id in the control plane.")
    salt: str = Field(
        min_length=16,
        max_length=256,
        description="Secret key of the digests of block hashes and session keys: ids are "
        "comparable within the capture, and no content can be guessed from them.",
    )
    _config_version: int = PrivateAttr(default=0)

    @property
    def config_version(self) -> int:
        """The version of the configuration this capture came with (0: none given)."""
        return self._config_version


class RouterConfig(_Strict):
    version: int = Field(default=0, ge=0)
    cluster: str = "default"
    model: str | None = Field(
        default=None, description="Served model name; requests naming another model get 404."
    )
    block_size: int = Field(default=16, ge=1, le=4096)
    instances: list[InstanceSpec] = Field(min_length=1)
    policy: PolicySpec
    canary: CanarySpec | None = None
    router: RouterSettings = Field(default_factory=RouterSettings)
    client_auth: ClientAuthSpec = Field(default_factory=ClientAuthSpec)
    capture: CaptureSpec | None = None
    session_sources: list[SessionSource] = Field(
        default_factory=lambda: list(SESSION_SOURCES),
        description="Where SMetric and the canary arms read a request's session from, first "
        "found wins, in this order whatever the list's: header (X-Session-ID), harness "
        "(agent harnesses' session headers: X-Dynamo-Session-ID, Claude Code's, Codex's "
        "session-id), response_chain (a Responses previous_response_id chain), user (the "
        "body's user; a Messages request's metadata.user_id). A source left out is not read.",
    )
    tenants: list[TenantSettings] = Field(
        default_factory=list,
        max_length=10_000,
        description="Tenants and their flow-control settings; keys without a tenant and "
        "requests without a key belong to `default` (standard class, weight 1, no limits "
        "unless listed here).",
    )
    flow: FlowParams = Field(default_factory=FlowParams)
    disaggregation: DisaggregationSpec | None = Field(
        default=None,
        description="Prefill/decode disaggregation: the decode stage's policy and the "
        "decider (unset: their defaults when some instance is not of role both).",
    )

    @property
    def disaggregated(self) -> bool:
        """Some instance is a prefill or a decode instance, or the document configures
        disaggregation (then instances of role both may prefill for one another)."""
        if self.disaggregation is not None:
            return True
        return any(instance.role != "both" for instance in self.instances)

    @property
    def stages(self) -> DisaggregationSpec:
        """The disaggregation settings in force (the defaults when unset)."""
        return self.disaggregation or DisaggregationSpec()

    @model_validator(mode="after")
    def _pools_exist(self) -> RouterConfig:
        if self.disaggregated:
            roles = {i.role for i in self.instances}
            if not roles & {"prefill", "both"}:
                raise ValueError("instances.role: a disaggregated cluster needs a prefill pool")
            if not roles & {"decode", "both"}:
                raise ValueError("instances.role: a disaggregated cluster needs a decode pool")
        return self

    @model_validator(mode="before")
    @classmethod
    def _chat_template_from_model(cls, data: Any) -> Any:
        """An unset router.chat_template is the template of the model's family."""
        if not isinstance(data, dict):
            return data
        router = data.get("router")
        if isinstance(router, RouterSettings):
            router = router.model_dump(exclude_unset=True)
        router = {} if router is None else router
        if not isinstance(router, dict) or router.get("chat_template") is not None:
            return data
        model = data.get("model")
        derived = template_for_model(model if isinstance(model, str) else None)
        return {**data, "router": {**router, "chat_template": derived}}

    @model_validator(mode="after")
    def _stamp_capture(self) -> RouterConfig:
        """The capture records each request's config version: it is this document's."""
        if self.capture is not None:
            self.capture._config_version = self.version
        return self

    @model_validator(mode="after")
    def _tenants_resolve(self) -> RouterConfig:
        names = [tenant.name for tenant in self.tenants]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"tenants.name must be unique; repeated: {duplicates}")
        known = {*names, DEFAULT_TENANT}
        unknown = sorted({k.tenant for k in self.client_auth.keys} - known)
        if unknown:
            raise ValueError(f"client_auth.keys.tenant names unknown tenants {unknown}")
        if "enabled" not in self.flow.model_fields_set:
            # One tenant has nobody to be fair between: its engines queue as they would
            # without a router in front (the control plane's clusters and replays alike).
            on = {"enabled": bool(self.tenants)}
            object.__setattr__(self, "flow", self.flow.model_copy(update=on))  # frozen
        if self.flow.enabled and self.flow.max_queued >= self.router.max_concurrency:
            if "max_queued" in self.flow.model_fields_set:
                raise ValueError(
                    f"flow.max_queued ({self.flow.max_queued}) must be below "
                    f"router.max_concurrency ({self.router.max_concurrency}): a waiting "
                    "request holds its concurrency slot"
                )
            # The default bound on a router with fewer slots (documents stored before flow
            # control, tests' small routers): half its slots may wait, the rest serve.
            fitted = {"max_queued": self.router.max_concurrency // 2}
            object.__setattr__(self, "flow", self.flow.model_copy(update=fitted))  # frozen
        return self

    @model_validator(mode="after")
    def _names_resolve(self) -> RouterConfig:
        names = [instance.name for instance in self.instances]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"instances.name must be unique; repeated: {duplicates}")
        if self.canary is not None:
            known = set(names)
            for arm in self.canary.arms:
                unknown = sorted(set(arm.instances) - known)
                if unknown:
                    raise ValueError(f"canary arm {arm.name!r} names unknown instances {unknown}")
                if arm.decode_policy is not None and not self.disaggregated:
                    raise ValueError(
                        f"canary arm {arm.name!r} sets a decode_policy, but no instance is a "
                        "prefill or decode instance: there is no decode stage"
                    )
        return self


def describe_validation_error(error: ValidationError) -> str:
    """One line per problem, each naming the field path, e.g. `policy.params.w: ...`."""
    lines = []
    for item in error.errors():
        path = ".".join(str(part) for part in item["loc"]) or "(document)"
        lines.append(f"{path}: {item['msg']}")
    return "; ".join(lines)


def parse_config(document: dict[str, Any]) -> RouterConfig:
    """Validate a configuration document or raise ConfigError naming the fields at fault."""
    try:
        return RouterConfig.model_validate(document)
    except ValidationError as error:
        raise ConfigError(describe_validation_error(error)) from None
