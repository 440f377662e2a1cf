"""Request and response bodies of the API (their JSON schemas are the OpenAPI document)."""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Annotated, Any, Literal

from ninja import Field, Schema
from pydantic import AfterValidator

from controlplane.selectors import replays as replay_selectors
from router_worker.contract.telemetry import DecisionRecord

MAX_PK = 2**63 - 1
NO_NUL = r"^[^\x00]*$"  # Postgres text cannot hold NUL characters

Id = Annotated[int, Field(ge=1, le=MAX_PK)]
Name = Annotated[str, Field(min_length=1, max_length=64, pattern=NO_NUL)]
Text = Annotated[str, Field(max_length=10_000, pattern=NO_NUL)]
Reason = Annotated[
    str,
    Field(
        max_length=10_000,
        pattern=NO_NUL,
        description="Why; required for changes that affect routing.",
    ),
]


def _without_nul(value: Any) -> Any:
    if isinstance(value, str) and "\x00" in value:
        raise ValueError("text cannot contain NUL characters")
    children = (
        value.values() if isinstance(value, dict) else (value if isinstance(value, list) else ())
    )
    for child in [*children, *(value.keys() if isinstance(value, dict) else ())]:
        _without_nul(child)
    return value


JsonObject = Annotated[dict[str, Any], AfterValidator(_without_nul)]


def _in_utc(value: datetime) -> datetime:
    """Postgres refuses UTC offsets beyond ±16 h; any instant is fine once in UTC."""
    try:
        return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
    except OverflowError:
        raise ValueError("datetime out of range") from None


Timestamp = Annotated[datetime, AfterValidator(_in_utc)]


class ErrorDetail(Schema):
    message: str
    field: str | None = None


class ErrorOut(Schema):
    error: ErrorDetail


ExpectedRevision = Annotated[
    int | None,
    Field(
        None,
        ge=0,
        le=MAX_PK,
        description="The cluster revision this edit was prepared against (GET /clusters/{id}); "
        '409 with current_revision if it changed since. Or send If-Match: "r<N>".',
    ),
]


class ReasonIn(Schema):
    reason: Reason
    expected_revision: ExpectedRevision = None


class GreyOverrideIn(ReasonIn):
    mode: Literal["auto", "healthy", "drained"]


class MeOut(Schema):
    username: str
    role: str


# Clusters and instances


class ClusterIn(Schema):
    name: Name
    model: Annotated[str, Field(min_length=1, max_length=128, pattern=NO_NUL)] = Field(
        description="Served model as enginesim's cost model knows it: its key "
        "(e.g. qwen2-7b), its served name (Qwen/Qwen2-7B-Instruct), or that name without "
        "the organisation or -Instruct; another is refused (400) naming the known ones."
    )
    gpu_type: Annotated[str, Field(min_length=1, max_length=32, pattern=NO_NUL)] = Field(
        description="GPU as enginesim's cost model knows it (e.g. h20, h100; any case); "
        "another is refused (400) naming the known ones."
    )
    block_size: int = Field(16, ge=1, le=4096)
    reason: Reason = ""


class ClusterOut(Schema):
    id: int
    name: str
    model: str
    gpu_type: str
    block_size: int
    active_policy_id: int | None
    active_policy: str | None = Field(None, description="Name of the active policy.")
    revision: int = Field(
        description="Counts edits of the routing state; send it back as "
        "expected_revision (or If-Match) with an edit."
    )
    created_at: datetime

    @staticmethod
    def resolve_active_policy(cluster: Any) -> str | None:
        return cluster.active_policy.name if cluster.active_policy_id else None


class InstanceIn(Schema):
    name: Name
    url: Annotated[str, Field(min_length=1, max_length=256, pattern=NO_NUL)]
    kv_events: Annotated[str, Field(max_length=256, pattern=NO_NUL)] = ""
    reason: Reason
    expected_revision: ExpectedRevision = None


class InstanceRoleIn(ReasonIn):
    role: Literal["prefill", "decode", "both"]


class InstanceOut(Schema):
    id: int
    cluster_id: int
    name: str
    url: str
    kv_events: str
    state: str
    role: str
    grey_override: str
    healthy: bool | None
    last_seen_at: datetime | None


# Policies


class ParamProvenanceOut(Schema):
    """Where a parameter's default comes from (router_worker/routing/provenance.py)."""

    provenance: Literal["derived", "matrix", "paper", "design", "operational"] = Field(
        description="derived: filled per cluster from its GPU and model (blank = derive); "
        "matrix: chosen on the evaluation matrix (see measured_on); paper: the published "
        "algorithm's value or form (see source); design: Switchyard's own choice, not tuned; "
        "operational: a bound or size with no routing effect"
    )
    label: str = Field(description="The provenance as the policy form shows it.")
    measured_on: str | None = Field(
        None, description="The fleet the default was chosen or computed on."
    )
    source: str | None = Field(None, description="The published algorithm it comes from.")


class CellBreakOut(Schema):
    cell: str = Field(description="regime@fleet/load, as the robustness suite names it")
    breaches: list[str] = Field(
        description='Each broken bound, e.g. "throughput 0.94× round robin\'s"'
    )


class PolicyRobustnessOut(Schema):
    """A policy kind's record in the robustness suite (bench/robustness/run.py)."""

    status: Literal["keeps", "breaks", "not_judged", "unavailable"] = Field(
        description="keeps / breaks the never-collapse invariant in the last whole run; "
        "not_judged: not in it (the invariant's references); unavailable: no run recorded "
        "or its summary unreadable"
    )
    headline: str = Field(description="The sentence the policy form shows.")
    cells: int | None = Field(None, description="Cells of the suite the kind ran in.")
    breaks: list[CellBreakOut] = Field(description="The cells where it breaks the invariant.")
    generated: date | None = Field(None, description="The day of the run.")
    invariant: str = Field("", description="What the suite checks, as the run states it.")


class PolicyKindOut(Schema):
    kind: str
    description: str
    params_schema: dict[str, Any] = Field(
        description="The parameters' JSON schema; each property also carries its provenance "
        "(provenance, measured_on, source), as params_provenance lists them."
    )
    params_provenance: dict[str, ParamProvenanceOut] = Field(
        description="Per parameter (nested ones by dotted path, e.g. hotspot.window_s): where "
        "its default comes from."
    )
    robustness: PolicyRobustnessOut


class PolicyIn(Schema):
    name: Name
    kind: Annotated[str, Field(min_length=1, max_length=32, pattern=NO_NUL)]
    params: JsonObject = Field(default_factory=dict)
    description: Text = ""
    reason: Reason = ""


class PolicyOut(Schema):
    id: int
    cluster_id: int
    name: str
    kind: str
    params: dict[str, Any]
    description: str
    created_at: datetime
    active: bool


# Canaries


class CanaryIn(Schema):
    name: Name
    baseline_policy_id: Id
    candidate_policy_id: Id
    baseline_instances: list[Name] = Field(description="Instance names of the baseline arm.")
    candidate_instances: list[Name] = Field(description="Instance names of the candidate arm.")
    candidate_decode_policy_id: Id | None = Field(
        None,
        description="A disaggregated cluster only: the candidate arm places its decode stage "
        "with this policy of the cluster's (the baseline arm with the cluster's decode "
        "policy); promoting the canary makes it the cluster's. Omitted: both arms decode "
        "under the cluster's.",
    )
    weight_steps: list[float] | None = Field(
        None,
        description="Candidate traffic share per step, percent, increasing, in (0, 100]; the "
        "baseline gets the rest, so each step's weights sum to 100. Omitted: this "
        "deployment's default (GET /canary-defaults).",
    )
    guardrails: dict[str, Any] | None = Field(
        None,
        description="Any of the guardrails, as numbers (GET /canary-defaults lists each with "
        "its default, limit and meaning; min_samples and max_failures are whole numbers, "
        "min_samples at least 1); the others take the deployment's defaults. Each bad one is "
        "refused (400) naming it as guardrails.<name>.",
    )
    assignment_key: Literal["session", "random"] = "session"
    source_replay_id: Id | None = Field(
        None,
        description="The replay (of this cluster) whose recommendation the canary tests, as "
        "the replay page's button sets it; the replay then lists the canary.",
    )
    reason: Reason


class JudgementOut(Schema):
    id: int
    at: datetime
    step_index: int
    verdict: str = Field(description="pass | fail | inconclusive | halt | error")
    action: str = Field(
        description="advance | promote | retry | rollback | wait | pause | skipped (error: the "
        "judge could not judge this canary; the reason is in evidence.reasons)"
    )
    evidence: dict[str, Any] = Field(
        description=(
            "What the verdict rests on: step_index, candidate_weight (percent of traffic) and "
            "step_started_at of the judged step; arms (per arm: requests, errors, "
            "hotspot_fallbacks, ttft_samples, tpot_samples); tests (per metric: n per arm, "
            "median per arm in seconds, effect = relative change of the candidate's median, "
            "Mann-Whitney p_value, outcome); guards (name, value, limit, passed); reasons; for a "
            "halt, patience (step_age_s, max_wait_s, usable samples and sample rates per arm, "
            "expected_in_s: when min_samples is expected at those rates, null when an arm "
            "has none)."
        )
    )


class TimelineRowOut(Schema):
    first_id: int
    last_id: int
    first_at: datetime
    last_at: datetime
    count: int = Field(
        description="Judgements in this row: consecutive ones of one step that changed nothing "
        "(action wait or skipped) are one row; every other judgement is a row of its own."
    )
    step_index: int
    verdict: str
    action: str
    evidence: dict[str, Any] = Field(description="The newest judgement's evidence.")


class CanaryDefaultsOut(Schema):
    weight_steps: list[float]
    guardrails: dict[str, dict[str, Any]] = Field(
        description="Per guardrail: default, minimum and limit (smallest and largest "
        "accepted value), whole (true: a whole number) and help."
    )


class CanaryOut(Schema):
    id: int
    cluster_id: int
    name: str
    state: str
    baseline_policy_id: int
    candidate_policy_id: int
    candidate_decode_policy_id: int | None = None
    baseline_instances: list[str]
    candidate_instances: list[str]
    assignment_key: str
    weight_steps: list[float]
    step_index: int
    candidate_weight: float
    guardrails: dict[str, float]
    failures: int
    step_started_at: datetime | None
    created_at: datetime
    source_replay_id: int | None = Field(
        None, description="The replay whose recommendation it tests, if started from one."
    )


class CanaryDetailOut(CanaryOut):
    judgements: list[JudgementOut]


# Config versions and routers


class ConfigVersionOut(Schema):
    id: int
    cluster_id: int
    number: int
    document: dict[str, Any] = Field(
        description="The document routers apply, less the canary's arm-assignment salt "
        "(routers read it with their token; a client who knew it could pick its arm), and "
        "the traffic capture's digest key."
    )
    created_at: datetime
    created_by: str
    reason: str

    @staticmethod
    def resolve_document(version: Any) -> dict[str, Any]:
        from controlplane.services.config import without_secrets

        return without_secrets(version.document)


class RouterDeploymentIn(Schema):
    name: Name
    host: Annotated[str, Field(min_length=1, max_length=128, pattern=NO_NUL)]
    port: int = Field(ge=1, le=65535)
    reason: Reason = ""


class RouterDeploymentOut(Schema):
    id: int
    cluster_id: int
    name: str
    host: str
    port: int
    desired_state: str
    applied_version: int | None
    current_version: int | None = Field(
        None, description="Newest config version of the router's cluster."
    )
    is_current: bool
    last_heartbeat: datetime | None
    heartbeat: dict[str, Any]
    restarts: int

    @staticmethod
    def resolve_is_current(router: Any) -> bool:
        current = getattr(router, "current_version", None)
        return current is not None and router.applied_version == current


class RouterDeploymentCreatedOut(Schema):
    router: RouterDeploymentOut
    token: str = Field(description="The router's bearer token. Shown only this once.")


class HeartbeatIn(Schema):
    applied_version: int | None = Field(None, ge=0, le=2**31 - 1)
    state: JsonObject = Field(
        default_factory=dict, description="The router's state snapshot (free-form)."
    )


class HeartbeatOut(Schema):
    applied_version: int | None
    current_version: int | None
    is_current: bool


# Events, rollups, replays


class HotspotEventOut(Schema):
    id: int
    event_id: str
    cluster_id: int
    router: str
    at: datetime
    transition: str
    prefix_class: str
    prefix_hash: str
    x: float
    x_bar: float
    m: int
    m_bar: int
    window: float
    instances: list[Any]
    details: dict[str, Any]


class QuarantinedEntryOut(Schema):
    id: str = Field(description="Id in the dead-letter stream")
    source: str = Field(description="The stream the entry was read from")
    entry_id: str = Field(description="Its id in that stream")
    reason: str
    data: str = Field(description="The entry as it was sent (cut at 16 KiB)")
    data_bytes: int
    at: datetime = Field(description="When it was quarantined")


class QuarantineOut(Schema):
    total: int = Field(description="Entries quarantined, ever")
    counts: dict[str, int] = Field(description="Per source stream")
    entries: list[QuarantinedEntryOut] = Field(description="The newest ones, newest first")


class QuarantineFilters(Schema):
    limit: int = Field(50, ge=1, le=1000, description="How many of the newest entries")


class AuditEventOut(Schema):
    id: int
    at: datetime
    actor_name: str
    request_id: str
    action: str
    target_type: str
    target_id: str
    cluster_id: int | None
    before: Any
    after: Any
    reason: str


class _RollupOut(Schema):
    cluster_id: int
    minute: datetime
    requests: int
    errors: int
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    tpot_p50_s: float | None
    tpot_p99_s: float | None
    output_tokens: int


class ArmRollupOut(_RollupOut):
    arm: str
    hotspot_fallbacks: int


class InstanceRollupOut(_RollupOut):
    instance: str
    pending_prefill_tokens_max: int
    batch_size_max: int
    kv_usage_max: float


class ReplayPolicyIn(Schema):
    kind: Annotated[str, Field(min_length=1, max_length=32, pattern=NO_NUL)]
    params: JsonObject = Field(default_factory=dict)


class ReplayIn(Schema):
    trace: Annotated[str, Field(min_length=1, max_length=256, pattern=NO_NUL)]
    policies: list[ReplayPolicyIn] = Field(min_length=1, max_length=8)
    rate_scale: float = Field(1.0, gt=0, le=1000)
    rate_scales: list[Annotated[float, Field(gt=0, le=1000)]] | None = Field(
        None,
        min_length=1,
        max_length=4,
        description="Loads to replay at (rate scales); default [rate_scale].",
    )
    max_requests: int | None = Field(None, ge=1, le=10_000_000)  # services.replays.MAX_REQUESTS
    seed: int = Field(0, ge=0, le=2**31 - 65)
    seeds: int = Field(1, ge=1, le=10, description="Seeds per policy and load: seed, seed+1…")
    flow: Literal["cluster", "on", "off"] = Field(
        "cluster",
        description="The routers' flow control in the replay: as the cluster runs it (on "
        "when it has tenants), on, or off.",
    )
    tenant_scales: dict[
        Annotated[str, Field(min_length=1, max_length=64, pattern=NO_NUL)],
        Annotated[float, Field(ge=0, le=10)],
    ] = Field(
        default_factory=dict,
        max_length=8,
        description="Per tenant of the cluster (or default), its requests that many times "
        "as many: what if it doubles (2).",
    )
    reason: Reason = ""


class RecommendationLoadOut(Schema):
    rate_scale: float
    active: float = Field(description="The active policy's goodput (requests/s), mean over seeds.")
    candidate: float = Field(description="The recommended policy's goodput there.")
    diff: float = Field(description="candidate - active")
    noise: float | None = Field(
        description="The two 95% half-widths combined: a gain beyond it is not noise."
    )
    relative: float = Field(description="diff / active")


class RecommendationOut(Schema):
    """What the replay says about the policy the cluster ran when it was asked for, as the
    replay's page says it (controlplane/selectors/replays.py, ``recommendation``)."""

    active: int = Field(description="The active policy's id when the replay was asked for.")
    candidate: int | None = Field(
        description="The policy to canary next; null: keep the active one (see why)."
    )
    loads: list[RecommendationLoadOut] = Field(description="The candidate's gain per load.")
    why: Literal["wins", "no winner", "noise"] = Field(
        description="wins: the candidate beats the active policy on goodput beyond the noise "
        "at one load and is nowhere worse; no winner: none does; noise: the active policy's "
        "goodput has no interval (one seed), so a gain cannot be told from noise."
    )


class ReplayOut(Schema):
    id: int
    cluster_id: int
    created_by: str | None = Field(None, description="Username of who asked for it.")
    created_at: datetime
    inputs: dict[str, Any]
    state: str
    progress: float
    results: dict[str, Any] | None
    error: str
    finished_at: datetime | None

    recommendation: RecommendationOut | None = Field(
        None,
        description="Null until the job has results, or when the active policy was not "
        "among those replayed.",
    )
    canaries: list[int] = Field(
        default_factory=list, description="Canaries started from this replay, newest first."
    )

    @staticmethod
    def resolve_created_by(job: Any) -> str | None:
        return job.created_by.get_username() if job.created_by_id else None

    @staticmethod
    def resolve_recommendation(job: Any) -> dict[str, Any] | None:
        return replay_selectors.recommendation(job)

    @staticmethod
    def resolve_canaries(job: Any) -> list[int]:
        return replay_selectors.canary_ids(job)


class ReplayCellOut(Schema):
    index: int
    kind: str = Field(description="The replayed policy's kind.")
    policy: int = Field(description="The policy's index in inputs.policies.")
    rate_scale: float
    seed: int
    state: str
    progress: float
    attempts: int
    error: str
    finished_at: datetime | None


class ReplayDetailOut(ReplayOut):
    cells: list[ReplayCellOut] = Field(
        default_factory=list, description="One per policy, load and seed: a Celery task each."
    )

    @staticmethod
    def resolve_cells(job: Any) -> list[dict[str, Any]]:
        return [
            {**{f: getattr(row["cell"], f) for f in ReplayCellOut.model_fields if f != "kind"},
             "kind": row["kind"]}
            for row in replay_selectors.cells(job)
        ]  # fmt: skip


class ReplayCreatedOut(Schema):
    replay: ReplayOut
    dispatched: bool
    message: str


class DecisionOut(DecisionRecord):
    """One sampled routing decision, as the live view shows it (router_worker/README.md,
    "Telemetry out"), with its entry id in the cluster's decision stream."""

    id: str = Field(description="The stream entry's id: pass it as `after` to page on.")


class DecisionPageOut(Schema):
    decisions: list[DecisionOut] = Field(description="Newest first.")
    cursor: str | None = Field(
        description="The newest entry id seen (the `after` given when nothing is newer; null "
        "when the stream is empty): ask again with after=cursor for what came since."
    )


# Filters (query strings)


class TimeRange(Schema):
    since: Timestamp | None = None
    until: Timestamp | None = None


class HotspotFilters(TimeRange):
    cluster: Id | None = None
    prefix_class: Annotated[str, Field(max_length=64, pattern=NO_NUL)] | None = None
    transition: Literal["suspected", "confirmed", "cleared"] | None = None


class AuditFilters(TimeRange):
    cluster: Id | None = None
    action: Annotated[str, Field(max_length=64, pattern=NO_NUL)] | None = None
    actor: Annotated[str, Field(max_length=150, pattern=NO_NUL)] | None = None


class ArmRollupFilters(TimeRange):
    arm: Annotated[str, Field(max_length=64, pattern=NO_NUL)] | None = None


class InstanceRollupFilters(TimeRange):
    instance: Annotated[str, Field(max_length=64, pattern=NO_NUL)] | None = None


class DecisionFilters(Schema):
    after: Annotated[str, Field(pattern=r"^\d{1,19}-\d{1,19}$")] | None = Field(
        None,
        description="A cursor (a decision stream entry id, `<ms>-<seq>`): only decisions "
        "after it, the oldest first taken, so that polling misses none the stream still holds.",
    )
    limit: int = Field(50, ge=1, le=500, description="The most decisions returned.")
