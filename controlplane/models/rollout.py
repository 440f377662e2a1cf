from __future__ import annotations

from django.db import models


class CanarySplit(models.Model):
    """A baseline and a candidate arm running side by side, traffic split by weight."""

    class State(models.TextChoices):
        DRAFT = "draft"
        PROGRESSING = "progressing"
        PAUSED = "paused"
        PROMOTED = "promoted"
        ROLLED_BACK = "rolled_back"
        ABORTED = "aborted"

    ACTIVE_STATES = (State.PROGRESSING, State.PAUSED)

    cluster = models.ForeignKey("Cluster", on_delete=models.CASCADE, related_name="canaries")
    name = models.CharField(max_length=64)
    baseline_policy = models.ForeignKey("Policy", on_delete=models.PROTECT, related_name="+")
    candidate_policy = models.ForeignKey("Policy", on_delete=models.PROTECT, related_name="+")
    # A disaggregated cluster's candidate arm may decode under another policy (None: the
    # cluster's decode policy, as the baseline arm does).
    candidate_decode_policy = models.ForeignKey(
        "Policy", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    # the replay whose recommendation it tests, when it was started from one
    source_replay = models.ForeignKey(
        "ReplayJob", null=True, blank=True, on_delete=models.SET_NULL, related_name="canaries"
    )
    baseline_instances = models.JSONField(default=list)
    candidate_instances = models.JSONField(default=list)
    assignment_key = models.CharField(
        max_length=16, choices=[("session", "session"), ("random", "random")], default="session"
    )
    # Candidate traffic percentage per step, e.g. [10, 25, 50]; the last step then promotes.
    weight_steps = models.JSONField(default=list)
    step_index = models.IntegerField(default=0)
    # Guardrails: max_error_rate, max_hotspot_fallback_rate, min_samples, max_failures,
    # p_value, effect_tolerance, step_seconds.
    guardrails = models.JSONField(default=dict)
    failures = models.IntegerField(default=0)
    state = models.CharField(max_length=16, choices=State.choices, default=State.DRAFT)
    step_started_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.cluster.name}/{self.name} ({self.state})"

    @property
    def candidate_weight(self) -> float:
        if not self.weight_steps:
            return 0.0
        return float(self.weight_steps[min(self.step_index, len(self.weight_steps) - 1)])


class CanaryJudgement(models.Model):
    """One decision of the canary judge with its evidence (append-only)."""

    canary = models.ForeignKey(CanarySplit, on_delete=models.CASCADE, related_name="judgements")
    at = models.DateTimeField(auto_now_add=True)
    step_index = models.IntegerField()
    verdict = models.CharField(max_length=16)  # pass | fail | inconclusive | halt
    action = models.CharField(max_length=16)  # advance | promote | rollback | pause | wait
    evidence = models.JSONField(default=dict)

    class Meta:
        ordering = ["-at"]
