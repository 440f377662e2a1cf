from __future__ import annotations

from django.core.validators import RegexValidator
from django.db import models

from router_worker.routing.sessions import SESSION_SOURCES

slug_name = RegexValidator(
    r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
    "use 1-64 letters, digits, '.', '_' or '-', starting alphanumeric",
)


def all_session_sources() -> list[str]:
    """Every source a request's session is read from (the routers' default)."""
    return list(SESSION_SOURCES)


class Cluster(models.Model):
    """A fleet of engine instances serving one model on one GPU type."""

    name = models.CharField(max_length=64, unique=True, validators=[slug_name])
    model = models.CharField(max_length=128, help_text="Served model, e.g. Qwen/Qwen2-7B-Instruct")
    gpu_type = models.CharField(max_length=32, help_text="e.g. h20, h100")
    block_size = models.PositiveIntegerField(default=16)
    # Counts edits of the routing state (policy, canary, instances): an edit made against an
    # older revision is refused, so two operators never silently overwrite each other.
    revision = models.PositiveIntegerField(default=0)
    active_policy = models.ForeignKey(
        "Policy", null=True, blank=True, on_delete=models.PROTECT, related_name="active_on"
    )
    client_keys_required = models.BooleanField(
        default=False, help_text="Routers refuse requests without a valid client API key."
    )
    # Wall seconds per engine second: 1 for real engines; for a simulated cluster,
    # enginesim's --time-scale (the demo's engines run slowed). The live view says its
    # times are wall-clock at this scale; a capture started without one takes it.
    engine_time_scale = models.FloatField(default=1.0)
    # Where SMetric and the canary arms read a request's session from (the routing
    # document's session_sources: router_worker/routing/sessions.py).
    session_sources = models.JSONField(default=all_session_sources)

    class Decider(models.TextChoices):
        """When a disaggregated cluster's routers split a request (router_worker.routing.disagg)."""

        COST = "cost"
        PREFIX_THRESHOLD = "prefix_threshold"
        ALWAYS = "always"
        NEVER = "never"

    class KvLink(models.TextChoices):
        """The prefill → decode link the cost decider weighs (enginesim.engine.transfer)."""

        NVLINK = "nvlink"
        RDMA = "rdma"
        TCP = "tcp"

    # Read only while some instance is of role prefill or decode.
    decider = models.CharField(max_length=16, choices=Decider.choices, default=Decider.COST)
    # prefix_threshold: split past this many prompt tokens uncached on the decode pool
    decider_threshold_tokens = models.PositiveIntegerField(default=256)
    kv_link = models.CharField(max_length=8, choices=KvLink.choices, default=KvLink.RDMA)
    # Flow control's TPOT SLO (router_worker.routing.flow, ``flow.tpot_slo_s``), in ms:
    # set, the routers keep the engines' step time under it (and run flow control even
    # without tenants); None: off.
    flow_tpot_slo_ms = models.PositiveIntegerField(null=True, blank=True)
    # The decode stage's policy (one of the cluster's policies); None: decode_room.
    decode_policy = models.ForeignKey(
        "Policy", null=True, blank=True, on_delete=models.PROTECT, related_name="decode_on"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def is_disaggregated(self) -> bool:
        """Some instance is a prefill or a decode instance: its routers split requests."""
        return self.instances.exclude(role="both").exists()


class Instance(models.Model):
    class State(models.TextChoices):
        ENABLED = "enabled"
        DRAINING = "draining"
        DOWN = "down"

    class Role(models.TextChoices):
        """Prefill/decode disaggregation (router_worker.routing.disagg)."""

        PREFILL = "prefill"
        DECODE = "decode"
        BOTH = "both"

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="instances")
    name = models.CharField(max_length=64, validators=[slug_name])
    url = models.URLField(max_length=256)
    kv_events = models.CharField(max_length=256, blank=True, default="")
    state = models.CharField(max_length=16, choices=State.choices, default=State.ENABLED)
    role = models.CharField(max_length=8, choices=Role.choices, default=Role.BOTH)

    class GreyOverride(models.TextChoices):
        AUTO = "auto"  # the routers' grey-failure detector decides
        HEALTHY = "healthy"  # never flagged slow
        DRAINED = "drained"  # no traffic, no probes

    grey_override = models.CharField(
        max_length=16, choices=GreyOverride.choices, default=GreyOverride.AUTO
    )
    # Observed by the health/metrics scraper (beat), not desired state.
    healthy = models.BooleanField(null=True, default=None)
    last_scrape = models.JSONField(default=dict, blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["cluster", "name"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="instance_name_per_cluster")
        ]

    def __str__(self) -> str:
        return f"{self.cluster.name}/{self.name}"


class Policy(models.Model):
    """A named routing policy: kind plus parameters validated by the policy's own class."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="policies")
    name = models.CharField(max_length=64, validators=[slug_name])
    kind = models.CharField(max_length=32)
    params = models.JSONField(default=dict, blank=True)
    description = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["cluster", "name"]
        verbose_name_plural = "policies"
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="policy_name_per_cluster")
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"

    def spec(self) -> dict:
        return {"kind": self.kind, "params": self.params}
