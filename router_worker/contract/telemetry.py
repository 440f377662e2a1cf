"""What routers write to Redis and the control plane reads: key names and record shapes.

Producer: the live router's telemetry loop (router_worker). Consumers: the control plane's
publisher loop (live dashboard), the event ingest and the rollup task (Celery). Both sides
import this module so they cannot disagree. Routing never waits on Redis: the router keeps
serving when Redis is down, buffering events (bounded) and counting what it drops.

Keys
----
* ``state_key(cluster, router)``: the router's latest state snapshot (a JSON string,
  `StateSnapshot`), rewritten every `STATE_INTERVAL_S` with a TTL of `STATE_TTL_S`, so a dead
  router's state disappears by itself.
* ``events_stream(cluster)``: the cluster's Redis stream of events; each entry has one
  field ``data`` holding an `EventRecord` as JSON. Events carry a unique ``id`` assigned by
  the router, so ingest is idempotent however often an entry is delivered.
* ``router_metrics_stream(cluster, router)``: the router's request metrics every
  `METRICS_INTERVAL_S` (`MetricsRecord`), aggregated by the control plane into per-minute
  rollups; ingest takes a record there only under that router's name (no router of a
  cluster can file metrics for another). ``metrics_stream(cluster)``, where routers wrote
  them before, is still read, with no such check: a router with its own Redis identity
  cannot write it.
* ``EVENTS_STREAM``, ``METRICS_STREAM``: the same for every cluster at once, as routers
  wrote them before each cluster had its own. The control plane still reads them; a router
  with its own Redis identity (below) cannot write them.
* ``CONFIG_CHANNEL``: pub/sub, control plane → routers: a cluster has a new config version.
* ``peers_channel(cluster)``: pub/sub between the cluster's routers (router_worker/peers.py).

Every key and channel a router writes is its cluster's, so a Redis ACL confines it:
`router_acl_rules` is what a router of one cluster may do (its own state key, its cluster's
streams and peer channel; listening, never publishing, on ``CONFIG_CHANNEL``).
* ``decisions_stream(cluster)``: a sample of the cluster's recent routing decisions
  (`DecisionRecord`, field ``data``), for the live view. Capped at
  `DECISIONS_STREAM_MAXLEN` entries and expiring `DECISIONS_STREAM_TTL_S` after the last
  write: it is a window onto recent traffic, not a log (nothing ingests it).
* ``capture_stream(cluster)``: while the cluster captures its traffic (the config's
  ``capture``), every finished request as the replay needs it (`CaptureBatch`, field
  ``data``, up to `CAPTURE_BATCH` requests and `CAPTURE_BATCH_BLOCKS` blocks each). No
  text and no raw fingerprint travels: the prompt travels as keyed digests of its block
  hashes, the session key as a keyed digest, both under the capture's salt. Ingest stores
  them, and deletes the entries it stored.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from enum import StrEnum
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

STATE_INTERVAL_S = 0.25
STATE_TTL_S = 10
METRICS_INTERVAL_S = 1.0
# Pub/sub channel on which the control plane announces a new config version
# ({"cluster", "version"}); routers also poll, so a lost message only delays them.
CONFIG_CHANNEL = "switchyard:config"
# Environment variables a managed router reads (`python -m router_worker`) and the control
# plane's router launcher sets: the router's bearer token and the Redis it reports to.
ROUTER_TOKEN_ENV = "SWITCHYARD_ROUTER_TOKEN"
REDIS_URL_ENV = "SWITCHYARD_REDIS_URL"
# The cluster's key for signing replica-sync batches (router_worker/peers.py), and older
# keys still accepted while it rotates (comma-separated). Secrets, like the token: passed
# only in the environment, never on the command line nor in any page or API.
PEER_KEY_ENV = "SWITCHYARD_PEER_KEY"
PEER_KEY_PREVIOUS_ENV = "SWITCHYARD_PEER_KEY_PREVIOUS"
EVENTS_STREAM = "switchyard:events"
METRICS_STREAM = "switchyard:metrics"
STREAM_MAXLEN = 100_000
# Samples kept per arm per metrics record; enough for rank tests, bounded for Redis.
MAX_SAMPLES_PER_RECORD = 500
DECISIONS_STREAM_MAXLEN = 500
DECISIONS_STREAM_TTL_S = 3600
# Candidates carried per decision (best first); a larger cluster's record says how many
# were left out.
MAX_DECISION_CANDIDATES = 32

EventKind = Literal[
    "hotspot",  # a hotspot detector transition (payload: see HotspotPayload)
    "health",  # instance health changed: {instance, before, after, cause}
    "config_applied",  # {version}
    "config_rejected",  # {version, error}
    "retries_exhausted",  # {request_id, attempts, last_error, instances, request_suspected}
    "router_started",  # {pid, config_version}
    "router_restarted",  # written by the Celery supervisor: {exit_code, restarts}
    "events_dropped",  # {count}: buffered events lost during a Redis outage
    "kv_events_malformed",  # {instance, count, reasons: {reason: n}, example}: skipped
    # flow control's refusals since the last one, at most one a FLOW_SUMMARY_S:
    # {interval_s, tenants: {tenant: {reason: n}}} (reasons: routing.flow.Refusal.reason)
    "flow_refusals",
    "grey",  # grey-failure state changed: {instance, before, after, excess, cause}
]
FLOW_SUMMARY_S = 60.0


def state_key(cluster: str, router: str) -> str:
    return f"switchyard:state:{cluster}:{router}"


def state_pattern(cluster: str) -> str:
    return f"switchyard:state:{cluster}:*"


def decisions_stream(cluster: str) -> str:
    return f"switchyard:decisions:{cluster}"


def events_stream(cluster: str) -> str:
    return f"{EVENTS_STREAM}:{cluster}"


def metrics_stream(cluster: str) -> str:
    return f"{METRICS_STREAM}:{cluster}"


def router_metrics_stream(cluster: str, router: str) -> str:
    """One router's own metrics stream: the only one its Redis identity may write metrics
    to, so ingest files what it reads there under that router alone (the cluster's
    `metrics_stream` is still read, for routers without an identity)."""
    return f"{METRICS_STREAM}:{cluster}:{router}"


def capture_stream(cluster: str) -> str:
    return f"switchyard:capture:{cluster}"


def peers_channel(cluster: str) -> str:
    return f"switchyard:peers:{cluster}"


# What a router may run: write its telemetry, publish to and listen on its peers.
ROUTER_COMMANDS = (
    "+ping",
    "+select",
    "+client|setname",
    "+set",
    "+expire",
    "+xadd",
    "+publish",
    "+subscribe",
    "+unsubscribe",
)
# Those that name no key (the others are granted per key, in `router_acl_rules`).
ROUTER_KEYLESS_COMMANDS = tuple(c for c in ROUTER_COMMANDS if c not in ("+set", "+expire", "+xadd"))


def router_acl_rules(cluster: str, router: str) -> list[str]:
    """ACL SETUSER rules (after the user's password) for a router of ``cluster`` named
    ``router``. Names are slugs, so they hold no glob characters. The selector in
    parentheses lets it subscribe to the config notices without being able to publish
    them (a channel pattern alone would allow both)."""
    return [
        "resetkeys",
        "resetchannels",
        "-@all",
        *ROUTER_KEYLESS_COMMANDS,
        f"&{peers_channel(cluster)}",
        f"(+subscribe +unsubscribe &{CONFIG_CHANNEL})",
        # each command on the keys it is for: SET on its own state key only (SET on a
        # stream would replace it), XADD on its cluster's streams and its own metrics
        # stream, EXPIRE on the decisions window only
        f"(+set ~{state_key(cluster, router)})",
        f"(+xadd ~{events_stream(cluster)} ~{router_metrics_stream(cluster, router)}"
        f" ~{decisions_stream(cluster)} ~{capture_stream(cluster)})",
        f"(+expire ~{decisions_stream(cluster)})",
    ]


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore")


class HotspotPayload(_Record):
    transition: Literal["suspected", "confirmed", "cleared"]
    prefix_class: str
    prefix_hash: str
    x: float
    x_bar: float
    m: int
    m_bar: int
    window: float
    instances: list[str] = Field(default_factory=list)


class EventRecord(_Record):
    id: str
    cluster: str
    router: str
    kind: EventKind
    at: float  # unix seconds
    payload: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def new(
        cls, cluster: str, router: str, kind: EventKind, at: float, **payload: Any
    ) -> EventRecord:
        return cls(
            id=uuid.uuid4().hex, cluster=cluster, router=router, kind=kind, at=at, payload=payload
        )

    def to_stream_fields(self) -> dict[str, str]:
        return {"data": self.model_dump_json()}

    @classmethod
    def from_stream_fields(cls, fields: dict[bytes | str, bytes | str]) -> EventRecord:
        return cls.model_validate_json(_field(fields, "data"))


class Merge(StrEnum):
    """How the control plane merges one field of a per-instance or window record across
    the routers of a cluster that report it, declared on the field (``Annotated[type,
    Merge.X]``) and applied by ``controlplane/realtime/snapshot.py``, which refuses a
    record with a field that declares none. A missing value (None) never wins."""

    SAME = "same"  # the key the reports are grouped by
    TOTAL = "total"  # router-local accounting: disjoint between routers, so summed
    LARGEST = "largest"  # engine-reported: the same engine seen by each router (a counter:
    # the newest is the largest)
    WORST_HEALTH = "worst_health"  # any router's circuit breaker counts
    ANY = "any"  # true if any router says so
    NEWEST_CONFIG = "newest_config"  # a fact of the configuration: the newest router's
    LONGEST = "longest"  # a window's length
    WEIGHTED_MEAN = "weighted_mean"  # a mean, weighted by each router's requests
    WORST = "worst"  # a percentile or spread: the worst router's (they do not merge exactly)
    BY_KEY = "by_key"  # a mapping of records: key by key, each field by its own rule


def merge_rule(record: type[BaseModel], field: str) -> Merge | None:
    """The merge rule ``field`` of ``record`` declares, if any."""
    return next((m for m in record.model_fields[field].metadata if isinstance(m, Merge)), None)


class InstanceSnapshot(_Record):
    name: Annotated[str, Merge.SAME]
    health: Annotated[Literal["healthy", "draining", "down"], Merge.WORST_HEALTH]
    pending_prefill_tokens: Annotated[float, Merge.TOTAL]
    # maximum over the last interval: spikes survive; the sum of maxima bounds the maximum
    pending_prefill_tokens_max: Annotated[float, Merge.TOTAL]
    # the engine's running batch, scrape-corrected by each router: the views overlap
    batch_size: Annotated[float, Merge.LARGEST]
    batch_size_max: Annotated[float, Merge.LARGEST]
    in_flight: Annotated[int, Merge.TOTAL]
    waiting: Annotated[int | None, Merge.LARGEST] = None  # from the engine's /metrics
    running: Annotated[int | None, Merge.LARGEST] = None
    kv_usage: Annotated[float | None, Merge.LARGEST] = None
    # prefix-cache hits / queries, from the engine
    hit_ratio: Annotated[float | None, Merge.LARGEST] = None
    # Requests the engine preempted (evicted from the KV cache to recompute), since its
    # start: vllm:num_preemptions. Climbing means the fleet is short of KV room.
    preemptions: Annotated[float | None, Merge.LARGEST] = None
    # The silent-fallback alarm (router_worker/hit_audit.py): this router predicts prefix
    # hits on the instance that its engine's counters do not confirm; None: not judged yet.
    silent_fallback: Annotated[bool | None, Merge.ANY] = None
    # Global KV tier (engine counters since its start; None: the engine has no tier)
    tier_hit_tokens: Annotated[float | None, Merge.LARGEST] = None  # prompt tokens loaded
    tier_bytes_read: Annotated[float | None, Merge.LARGEST] = None
    hotspot: Annotated[bool, Merge.ANY] = False  # confirmed by any router's detector
    # Grey-failure detection (router_worker/routing/grey.py): 0 healthy, 1 suspect,
    # 2 degraded (weight lowered), 3 drained (probed); and how much slower than its own
    # normal, beyond the fleet's drift, the instance runs (a ratio, 1 = none).
    grey_level: Annotated[int | None, Merge.LARGEST] = None
    grey_excess: Annotated[float | None, Merge.LARGEST] = None
    arm: Annotated[str | None, Merge.NEWEST_CONFIG] = None
    # Disaggregation: the instance's role (prefill, decode, both) in the config; and, from
    # an engine with a KV connector (None without), its KV reads from prefill instances:
    # under way now, bytes per second over the last seconds, and failed since its start
    # (vllm:nixl_num_failed_transfers).
    role: Annotated[str | None, Merge.NEWEST_CONFIG] = None
    kv_transfers_in_flight: Annotated[float | None, Merge.LARGEST] = None
    kv_bytes_per_s: Annotated[float | None, Merge.LARGEST] = None
    kv_failed_transfers: Annotated[float | None, Merge.LARGEST] = None


class DisaggregationStats(_Record):
    """A disaggregated cluster's decider and fallbacks at one router: requests split and
    kept colocated since the router started, of its last `DECIDER_RECENT` decisions how
    many were split (the live split ratio), and the split requests that ran colocated
    after all because their prefill or their decode stage failed before its first byte
    (a failed KV read among them)."""

    split: Annotated[int, Merge.TOTAL] = 0
    colocated: Annotated[int, Merge.TOTAL] = 0
    recent: Annotated[int, Merge.TOTAL] = 0
    recent_split: Annotated[int, Merge.TOTAL] = 0
    fallbacks: Annotated[int, Merge.TOTAL] = 0


DECIDER_RECENT = 200


class WindowStats(_Record):
    """Request statistics over the router's recent window (seconds given by `seconds`)."""

    seconds: Annotated[float, Merge.LONGEST]
    requests: Annotated[int, Merge.TOTAL]
    errors: Annotated[int, Merge.TOTAL]
    requests_per_s: Annotated[float, Merge.TOTAL]
    output_tokens_per_s: Annotated[float, Merge.TOTAL]
    ttft_p50_s: Annotated[float | None, Merge.WEIGHTED_MEAN] = None
    ttft_p99_s: Annotated[float | None, Merge.WORST] = None
    tpot_p50_s: Annotated[float | None, Merge.WEIGHTED_MEAN] = None
    tpot_p99_s: Annotated[float | None, Merge.WORST] = None
    # cached prompt tokens / prompt tokens routed
    hit_ratio: Annotated[float | None, Merge.WEIGHTED_MEAN] = None
    # stddev / mean of pending prefill tokens (the cluster's is recomputed over the
    # merged instances)
    load_cv: Annotated[float | None, Merge.WORST] = None


class ClassLane(_Record):
    """The requests of one tenant in one class (a request may lower its class) that ended
    in a router's recent window: their median TTFT (time queued included) and TPOT."""

    requests: Annotated[int, Merge.TOTAL]
    ttft_p50_s: Annotated[float | None, Merge.WEIGHTED_MEAN] = None  # its last requests'
    tpot_p50_s: Annotated[float | None, Merge.WEIGHTED_MEAN] = None


class TenantLane(_Record):
    """One tenant at one router's flow control over the router's recent window
    (``WindowStats.seconds``; the live view's lanes): what it was admitted and refused,
    what waits now, the tokens it was served (its share, against its weight), and per
    class the TTFT (time queued included) and TPOT of its requests that ended."""

    priority: Annotated[str, Merge.NEWEST_CONFIG]
    weight: Annotated[float, Merge.NEWEST_CONFIG]
    requests: Annotated[int, Merge.TOTAL]  # ended
    admitted: Annotated[int, Merge.TOTAL]  # at once or after waiting
    queued: Annotated[int, Merge.TOTAL]  # waiting now
    refused: Annotated[int, Merge.TOTAL]  # 429s and 503s
    served_tokens: Annotated[float, Merge.TOTAL]  # prompt + output tokens of ended requests
    ttft_p50_s: Annotated[float | None, Merge.WEIGHTED_MEAN] = None  # its last requests'
    tpot_p50_s: Annotated[float | None, Merge.WEIGHTED_MEAN] = None
    shed: Annotated[int, Merge.TOTAL] = 0  # of the refused, the 503s (the fleet's load)
    classes: Annotated[dict[str, ClassLane], Merge.BY_KEY] = Field(default_factory=dict)


class StateSnapshot(_Record):
    ts: float
    cluster: str
    router: str
    config_version: int | None
    policy: str
    instances: list[InstanceSnapshot]
    window: WindowStats
    arms: dict[str, WindowStats] = Field(default_factory=dict)
    hotspots: list[HotspotPayload] = Field(default_factory=list)  # currently confirmed
    tenants: dict[str, TenantLane] = Field(default_factory=dict)  # flow control's lanes
    # None: the cluster is not disaggregated (or a router older than the field)
    disaggregation: DisaggregationStats | None = None


class ArmMetrics(_Record):
    policy: str
    requests: int = 0
    errors: int = 0
    output_tokens: int = 0
    hotspot_fallbacks: int = 0
    ttft_s: list[float] = Field(default_factory=list)  # bounded samples
    tpot_s: list[float] = Field(default_factory=list)


class InstanceMetrics(_Record):
    requests: int = 0
    errors: int = 0
    output_tokens: int = 0
    pending_prefill_tokens_max: float = 0
    batch_size_max: float = 0
    kv_usage_max: float = 0
    ttft_s: list[float] = Field(default_factory=list)
    tpot_s: list[float] = Field(default_factory=list)


class MetricsRecord(_Record):
    id: str
    cluster: str
    router: str
    start: float  # unix seconds; the record covers [start, end)
    end: float
    arms: dict[str, ArmMetrics] = Field(default_factory=dict)
    instances: dict[str, InstanceMetrics] = Field(default_factory=dict)

    def to_stream_fields(self) -> dict[str, str]:
        return {"data": self.model_dump_json()}

    @classmethod
    def from_stream_fields(cls, fields: dict[bytes | str, bytes | str]) -> MetricsRecord:
        return cls.model_validate_json(_field(fields, "data"))


class CandidateScore(_Record):
    """One instance as the policy weighed it for one request, with the indicators behind
    its score as the router saw them at decision time (None when not captured)."""

    instance: str
    score: float | None  # None: filtered out (unhealthy, or a hotspot class's holders)
    cached_tokens: int | None = None  # the request's prompt tokens cached there
    pending_prefill_tokens: float | None = None
    batch_size: float | None = None


class DecisionRecord(_Record):
    """One sampled routing decision: where a request went and why."""

    cluster: str
    router: str
    request_id: str
    at: float  # unix seconds of the decision
    arm: str
    canary: int | None = None  # the canary's id when the cluster runs one
    policy: str
    instance: str  # the instance that served it (or the last one tried)
    reason: str  # the policy's reason code (score, hotspot_fallback, session_stick, ...)
    attempts: int = 1
    tried: list[str] = Field(default_factory=list)  # instances that failed it before
    status: int | None = None
    ttft_s: float | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0  # on the chosen instance, as the router estimated
    hot_class: str | None = None  # the prefix class when a hotspot is involved
    hotspot_transitions: list[str] = Field(default_factory=list)  # raised by this decision
    priority: bool = False  # kept regardless of the routine sampling rate
    details: dict[str, float | int | str | bool | None] = Field(default_factory=dict)
    candidates: list[CandidateScore] = Field(default_factory=list)  # best score first
    candidates_total: int = 0

    def to_stream_fields(self) -> dict[str, str]:
        return {"data": self.model_dump_json()}

    @classmethod
    def from_stream_fields(cls, fields: dict[bytes | str, bytes | str]) -> DecisionRecord:
        return cls.model_validate_json(_field(fields, "data"))


def encode_block_hashes(hashes: tuple[int, ...] | list[int]) -> str:
    """Block hashes on the wire: base64 of little-endian uint64s (peer sync, capture)."""
    raw = np.asarray(hashes, dtype=np.uint64).astype("<u8").tobytes()
    return base64.b64encode(raw).decode("ascii")


def decode_block_hashes(text: str, most: int) -> tuple[int, ...]:
    """The inverse of `encode_block_hashes`; ValueError for anything else, or more than
    ``most`` hashes."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("not base64") from None
    if len(raw) % 8 or len(raw) // 8 > most:
        raise ValueError(f"not a whole number of at most {most} uint64")
    return tuple(np.frombuffer(raw, dtype="<u8").tolist())


CAPTURE_BATCH = 500  # captured requests per stream entry
# Blocks a captured prompt sends (its first ones: a million tokens in 16-token blocks), and
# per stream entry (~2.7 MiB of base64 at most, `MAX_CAPTURE_ENTRY_BYTES` with the rest):
# an entry stays small enough to store in one short transaction, whatever the prompts.
MAX_CAPTURE_BLOCKS = 65_536
CAPTURE_BATCH_BLOCKS = 262_144
MAX_CAPTURE_ENTRY_BYTES = 4 * 1024 * 1024


class CaptureRecord(_Record):
    """One finished request of a traffic capture: what a replay needs, never its text."""

    at: float  # unix seconds of its arrival at the router
    prompt_tokens: int
    output_tokens: int
    block_size: int
    # the prompt's full blocks' chained hashes (`encode_block_hashes`), at most
    # `MAX_CAPTURE_BLOCKS`, as keyed digests under the capture's salt (the batch's ``keyed``;
    # a batch of a router from before keying has the raw hashes, which ingest keys itself)
    block_hashes: str = ""
    session: str | None = None  # keyed digest of the session key, under the same salt
    turn: int | None = None  # 0-based, when the request says (chat messages)
    # its tenant as a keyed digest under the same salt (`CaptureKey.tenant`; `default`
    # as it is) and its class; None from a router older than the fields
    tenant: str | None = None
    priority: str | None = None
    instance: str = ""
    arm: str = ""  # the canary arm that served it ("default" without a canary)
    # the number of the config version it was routed under (with ``arm``: its policy);
    # None from a router older than the field
    config_version: int | None = None
    status: int = 0
    ttft_s: float | None = None
    tpot_s: float | None = None


class CaptureBatch(_Record):
    id: str
    cluster: str
    router: str
    capture: int  # the capture's id (the config's capture.id)
    requests: list[CaptureRecord]
    # the engines' context length as the router scraped it (the smallest instance's): a
    # replay of the capture must refuse what they refused and serve what they served
    max_model_len: int | None = None
    keyed: bool = False  # the block hashes are the capture's keyed digests already

    def to_stream_fields(self) -> dict[str, str]:
        return {"data": self.model_dump_json()}

    @classmethod
    def from_stream_fields(cls, fields: dict[bytes | str, bytes | str]) -> CaptureBatch:
        return cls.model_validate_json(_field(fields, "data"))


def _field(fields: dict[bytes | str, bytes | str], name: str) -> str:
    value = fields.get(name, fields.get(name.encode()))
    if value is None:
        raise ValueError(f"stream entry has no {name!r} field")
    return value.decode() if isinstance(value, bytes) else value


def dumps_state(snapshot: StateSnapshot) -> str:
    return snapshot.model_dump_json()


def loads_state(raw: bytes | str) -> StateSnapshot:
    return StateSnapshot.model_validate(json.loads(raw))
