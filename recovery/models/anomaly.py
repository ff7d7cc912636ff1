from __future__ import annotations

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from recovery.choices import (
    AnomalyKind,
    Attribution,
    Confirmation,
    EvidenceSource,
    EvidenceTrust,
    FailureCategory,
    Severity,
)
from recovery.models.workload import Attempt, Workload


class Anomaly(models.Model):
    """Something wrong with a workload: a crash, a hang or a straggler, with its evidence.

    A flood of identical lines is one anomaly with ``occurrences`` and the ranks and nodes
    involved. ``fingerprint`` makes recording idempotent: the same finding seen again by a
    re-delivered task updates the count instead of adding a row. Distinct findings past the
    caps on new anomalies (``MAX_NEW_ANOMALIES_PER_READ``, ``MAX_ANOMALIES_PER_ATTEMPT``) are
    folded into an existing one: they add to its ``occurrences`` and ``folded_findings``.
    """

    workload = models.ForeignKey(Workload, on_delete=models.CASCADE, related_name="anomalies")
    attempt = models.ForeignKey(
        Attempt, on_delete=models.CASCADE, null=True, blank=True, related_name="anomalies"
    )
    kind = models.CharField(max_length=16, choices=AnomalyKind.choices)
    category = models.CharField(max_length=32, choices=FailureCategory.choices, blank=True)
    attribution = models.CharField(
        max_length=32, choices=Attribution.choices, default=Attribution.UNKNOWN
    )
    severity = models.CharField(max_length=16, choices=Severity.choices, default=Severity.ERROR)
    signature = models.CharField(max_length=128, blank=True, help_text="Matched signature name.")
    evidence_line = models.TextField(blank=True, help_text="The line that decided the category.")
    evidence_excerpt = models.TextField(blank=True)
    implicated_nodes = models.JSONField(default=list, blank=True)
    implicated_ranks = models.JSONField(default=list, blank=True)
    occurrences = models.PositiveIntegerField(default=1)
    folded_findings = models.PositiveIntegerField(
        default=0,
        help_text="Distinct findings past the anomaly caps counted here instead of recorded.",
    )
    last_seen_at = models.DateTimeField(
        null=True, blank=True, help_text="When evidence of it (or of a folded finding) last came."
    )
    details = models.JSONField(default=dict, blank=True, help_text="Secondary findings.")
    fingerprint = models.CharField(max_length=64)
    evidence_at = models.DateTimeField(help_text="When the evidence was produced.")
    detected_at = models.DateTimeField(default=timezone.now)
    confirmation = models.CharField(
        max_length=16,
        choices=Confirmation.choices,
        blank=True,
        help_text="For a crash: whether the process was seen to end. Blank for hangs and "
        "stragglers.",
    )
    confirmation_at = models.DateTimeField(
        null=True, blank=True, help_text="When the crash was confirmed, survived or stalled."
    )
    confirmation_reason = models.CharField(max_length=255, blank=True)
    evidence_source = models.CharField(
        max_length=16, choices=EvidenceSource.choices, blank=True, help_text="Where it was seen."
    )
    evidence_trust = models.CharField(
        max_length=8,
        choices=EvidenceTrust.choices,
        blank=True,
        help_text="Site facts alone may flag a node suspect across workloads; what a job "
        "printed or pushed acts on that job only.",
    )
    decided_at = models.DateTimeField(
        null=True, blank=True, help_text="When the policy engine took this anomaly into account."
    )
    provider_due_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="Set while the external provider's verdict is awaited: from when it may be "
        "asked (again). The policy waits for it.",
    )
    decision_facts = models.JSONField(
        default=dict,
        blank=True,
        help_text="What the policy decided this anomaly on, as it was read then (the anomaly, "
        "the attempts, nodes kept out, recent actions) and what it decided: replaying a "
        "policy over recorded history reads these (recovery.loop.replay).",
    )
    drain_facts = models.JSONField(
        default=dict,
        blank=True,
        help_text="The nodes this anomaly's drains were decided on, as read then, and what was "
        "decided for each (recovery.loop.replay).",
    )

    # What a decision and its drains were made on: tens of kilobytes on a busy cluster (every
    # node other jobs' restarts excluded within the day). Reads that only match, count or
    # update anomalies leave them out (``.defer(*Anomaly.FACTS)``).
    FACTS = ("decision_facts", "drain_facts")

    class Meta:
        ordering = ["-detected_at", "-id"]
        verbose_name_plural = "anomalies"
        constraints = [
            models.UniqueConstraint(
                fields=["workload", "attempt", "fingerprint"], name="anomaly_fingerprint_unique"
            )
        ]
        indexes = [
            models.Index(fields=["category", "detected_at"]),
            # Insights count anomalies per hour or day over a range of detection times.
            models.Index(fields=["detected_at"]),
            # The poll asks the provider for the verdicts still awaited after a worker died.
            models.Index(fields=["provider_due_at"]),
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.category or ''} on {self.workload}".strip()

    @property
    def detection_latency_seconds(self) -> float:
        return (self.detected_at - self.evidence_at).total_seconds()

    @property
    def confirmation_latency_seconds(self) -> float | None:
        """From the evidence to the moment the crash was confirmed, if it was."""
        if self.confirmation != Confirmation.CONFIRMED or self.confirmation_at is None:
            return None
        return (self.confirmation_at - self.evidence_at).total_seconds()

    @property
    def last_lines(self) -> list[str]:
        """The last lines the job printed, as the loop kept them with the failure."""
        lines = (self.details or {}).get("last_lines")
        if not isinstance(lines, list):
            return []
        return [line for line in lines if isinstance(line, str)]

    @property
    def evidence_provenance(self) -> str:
        """Where the evidence came from and whether the job's user controls it, in words."""
        source = self.get_evidence_source_display() if self.evidence_source else "not recorded"
        trust = "site fact" if self.evidence_trust == EvidenceTrust.SITE else "user-controlled"
        return f"{source} ({trust})"


class Verdict(models.Model):
    """An attribution of an anomaly to a layer, by the built-in rules or an external provider."""

    BUILTIN_PROVIDER = "builtin"

    anomaly = models.ForeignKey(Anomaly, on_delete=models.CASCADE, related_name="verdicts")
    provider = models.CharField(max_length=64, default=BUILTIN_PROVIDER)
    attribution = models.CharField(max_length=32, choices=Attribution.choices)
    confidence = models.FloatField(validators=[MinValueValidator(0.0), MaxValueValidator(1.0)])
    implicated_nodes = models.JSONField(default=list, blank=True)
    detail = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(confidence__gte=0.0) & models.Q(confidence__lte=1.0),
                name="verdict_confidence_range",
            )
        ]

    def __str__(self) -> str:
        return f"{self.provider}: {self.attribution} ({self.confidence:.0%})"
