from __future__ import annotations

from typing import ClassVar

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from recovery.choices import (
    CRASH_ACTIONS,
    SIGNATURE_CATEGORIES,
    Attribution,
    ClusterNodeState,
    DivergenceAction,
    FailureCategory,
    RecommendationAction,
    StragglerAction,
)
from recovery.detection.linear_regex import PatternError, compile_linear
from recovery.detection.scanner.progress_sampling import DEFAULT_NONFINITE_STEPS
from recovery.models.cluster import Cluster


def default_exclusion_attributions() -> list[str]:
    return [Attribution.HARDWARE.value]


def default_cluster_node_states() -> list[str]:
    # Both are set only by evidence users do not control (see recovery.loop.nodes).
    return [ClusterNodeState.EXCLUDED.value, ClusterNodeState.UNHEALTHY.value]


def default_exclusion_categories() -> list[str]:
    return [FailureCategory.GPU_HARDWARE.value, FailureCategory.INTERCONNECT.value]


# Said in the help of the settings read only from the cluster's policy (``FOR_THE_SITE`` alone).
SITE_SETTING = "Effects on nodes and other jobs: read from the cluster's policy."


class Policy(models.Model):
    """What an anomaly leads to, for the workloads in its scope.

    The scope is a cluster, an environment and a partition, each optional; for a workload the
    enabled policy matching the most of them wins.

    A workload's policy is chosen twice (``recovery.loop.policy``), and each choice is read for
    its own settings. The environment a job names in its comment chooses the policy of its
    own recovery (``policy_for``): only the ``FOR_THE_JOB`` settings are read from it, what
    touches that job alone. Whatever reaches beyond the job (nodes excluded on the cluster and
    for how long, the cluster's nodes kept out of every restart, suspects, drains, the blast
    radius) follows the ``FOR_THE_SITE`` settings of the cluster's policy, chosen by cluster
    and partition with the cluster's environment (``site_policy_for``); the job's environment
    counts there only where an operator bound it to the job's partition or account
    (``EnvironmentBinding``). A setting in both sets is read from each policy for its own
    part: the job's policy for the job's own next attempts, the cluster's for the cluster.
    """

    FOR_THE_JOB: ClassVar[frozenset[str]] = frozenset(
        {
            "crash_action",
            "exclude_on_attributions",  # the nodes its own next attempt avoids
            "exclude_on_categories",
            "exclusion_hours",
            "max_attempts",
            "max_attempts_without_checkpoint",
            "stop_on_application_fault",
            "hang_timeout_minutes",
            "hang_step_time_factor",
            "straggler_threshold_percent",
            "straggler_window_minutes",
            "straggler_action",
            "decision_grace_seconds",
            "crash_confirmation_seconds",
            "crash_confirmation_step_factor",
            "decision_timeout_seconds",
            "recommendation_ttl_minutes",  # its own restarts and stops
            "nonfinite_steps",
            "loss_spike_factor",
            "throughput_collapse_percent",
            "divergence_action",
            "progress_pattern",
            "checkpoint_pattern",
        }
    )
    FOR_THE_SITE: ClassVar[frozenset[str]] = frozenset(
        {
            "exclude_on_attributions",  # which evidence excludes a node on the cluster, or
            "exclude_on_categories",  # counts towards making it suspect
            "exclusion_hours",  # Node.excluded_until, unhealthy nodes kept out, rejected drains
            "keep_out_cluster_nodes",
            "drain_nodes",
            "suspect_node_workloads",
            "suspect_window_hours",
            "blast_radius_percent",
            "blast_radius_window_minutes",
            "recommendation_ttl_minutes",  # drains and resumes
        }
    )

    name = models.CharField(max_length=128, unique=True)
    enabled = models.BooleanField(default=True)
    cluster = models.ForeignKey(
        Cluster,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="policies",
        help_text="Empty: every cluster.",
    )
    environment = models.CharField(
        max_length=63,
        blank=True,
        help_text="Empty: any. A job naming this environment gets this policy for its own "
        "recovery; for effects on nodes and other jobs only where it is the cluster's "
        "environment or an environment binding lets the job's partition or account choose it.",
    )
    partition = models.CharField(max_length=64, blank=True, help_text="Empty: any.")

    crash_action = models.CharField(
        max_length=24,
        choices=CRASH_ACTIONS,
        default=RecommendationAction.RESTART,
        help_text="What a crash leads to; implicated nodes are excluded as configured below.",
    )
    exclude_on_attributions = models.JSONField(
        default=default_exclusion_attributions,
        blank=True,
        help_text="Attributions whose implicated nodes are excluded from the job's next "
        "attempt. In the cluster's policy also: the site facts that exclude a node on the "
        "cluster or count towards making it suspect.",
    )
    exclude_on_categories = models.JSONField(
        default=default_exclusion_categories,
        blank=True,
        help_text="Failure categories whose implicated nodes are excluded, as for the "
        "attributions above.",
    )
    exclusion_hours = models.PositiveIntegerField(
        default=24,
        validators=[MinValueValidator(1), MaxValueValidator(24 * 90)],
        help_text="How long implicated nodes stay out of the job's own next attempts. In the "
        "cluster's policy also: how long a node a site fact implicated stays excluded on the "
        "cluster, an unhealthy node stays out of every restart, and a rejected drain is not "
        "asked again.",
    )
    keep_out_cluster_nodes = models.JSONField(
        default=default_cluster_node_states,
        blank=True,
        help_text="Nodes in these states on the cluster are kept out of every job's restart, "
        "besides the job's own implicated nodes (excluded, unhealthy, suspect). Empty: only "
        "the job's own. " + SITE_SETTING,
    )
    max_attempts = models.PositiveIntegerField(
        default=10, validators=[MinValueValidator(1), MaxValueValidator(1000)]
    )
    max_attempts_without_checkpoint = models.PositiveIntegerField(
        default=3,
        validators=[MinValueValidator(1), MaxValueValidator(100)],
        help_text="Stop after this many consecutive attempts that saved no new checkpoint.",
    )
    stop_on_application_fault = models.BooleanField(
        default=False,
        help_text="Stop at once on an application fault a restart cannot fix.",
    )
    hang_timeout_minutes = models.PositiveIntegerField(
        default=30,
        validators=[MinValueValidator(1), MaxValueValidator(24 * 60)],
        help_text="Shortest silence that counts as a hang.",
    )
    hang_step_time_factor = models.FloatField(
        default=10.0,
        validators=[MinValueValidator(1.0), MaxValueValidator(1000.0)],
        help_text="A hang is also no progress for this many times the job's median step time.",
    )
    straggler_threshold_percent = models.PositiveIntegerField(
        default=20, validators=[MinValueValidator(1), MaxValueValidator(99)]
    )
    straggler_window_minutes = models.PositiveIntegerField(
        default=10, validators=[MinValueValidator(1), MaxValueValidator(24 * 60)]
    )
    straggler_action = models.CharField(
        max_length=24, choices=StragglerAction.choices, default=StragglerAction.RECORD
    )
    suspect_node_workloads = models.PositiveIntegerField(
        default=3,
        validators=[MinValueValidator(2), MaxValueValidator(1000)],
        help_text="A node implicated in this many workloads within the window is suspect. "
        + SITE_SETTING,
    )
    suspect_window_hours = models.PositiveIntegerField(
        default=24,
        validators=[MinValueValidator(1), MaxValueValidator(24 * 90)],
        help_text=SITE_SETTING,
    )
    drain_nodes = models.BooleanField(
        default=True,
        help_text="Recommend draining a node that a site fact (its kernel log, DCGM, the "
        "scheduler) blames on hardware. Off: such a node is only kept out of restarts. "
        + SITE_SETTING,
    )
    blast_radius_percent = models.PositiveIntegerField(
        default=10,
        validators=[MinValueValidator(1), MaxValueValidator(100)],
        help_text="Never exclude, restart or drain more than this share of the cluster in "
        "the window. " + SITE_SETTING,
    )
    blast_radius_window_minutes = models.PositiveIntegerField(
        default=60,
        validators=[MinValueValidator(1), MaxValueValidator(24 * 60)],
        help_text=SITE_SETTING,
    )
    decision_grace_seconds = models.PositiveIntegerField(
        default=30,
        validators=[MaxValueValidator(3600)],
        help_text="A crash known only by its symptoms (a rank lost its peer, a collective timed "
        "out) waits this long for its cause — a node going down, an Xid — unless the attempt "
        "ends first.",
    )
    crash_confirmation_seconds = models.PositiveIntegerField(
        default=10,
        validators=[MinValueValidator(1), MaxValueValidator(3600)],
        help_text="A crash read from a job's log is acted on once the process is seen to end, "
        "or when the job made no progress for this long after it (or the step-time factor "
        "below, or 1.5 times the longest quiet phase the job has shown, whichever is "
        "longest); then it is handled as a hang. Silence after an error the program handled, "
        "or after a checkpoint or evaluation it announced, is left to the hang timeout.",
    )
    crash_confirmation_step_factor = models.FloatField(
        default=3.0,
        validators=[MinValueValidator(1.0), MaxValueValidator(1000.0)],
        help_text="The confirmation window is also this many times the job's median step time.",
    )
    decision_timeout_seconds = models.PositiveIntegerField(
        default=300,
        validators=[MinValueValidator(5), MaxValueValidator(24 * 3600)],
        help_text="The watchdog releases a job held for a decision after this long.",
    )
    recommendation_ttl_minutes = models.PositiveIntegerField(
        default=30,
        validators=[MinValueValidator(1), MaxValueValidator(7 * 24 * 60)],
        help_text="A ready recommendation nobody executed expires after this long; for "
        "drains and resumes, as the cluster's policy says.",
    )
    nonfinite_steps = models.PositiveIntegerField(
        default=DEFAULT_NONFINITE_STEPS,
        validators=[MinValueValidator(1), MaxValueValidator(1000)],
        help_text="A loss or gradient norm that is not a number for this many logged steps in "
        "a row (per rank) is a NaN divergence. One is what an fp16 loss scaler skipping an "
        "overflowing step prints; with the loss scale at 1 one is always a failure.",
    )
    loss_spike_factor = models.FloatField(
        default=2.0,
        validators=[MinValueValidator(1.1), MaxValueValidator(100.0)],
        help_text="A loss above this many times its median before, for the whole straggler "
        "window, is a divergence.",
    )
    throughput_collapse_percent = models.PositiveIntegerField(
        default=50,
        validators=[MinValueValidator(1), MaxValueValidator(99)],
        help_text="A whole job whose throughput stays below this share of its own before, for "
        "the whole straggler window, slowed down (recorded).",
    )
    divergence_action = models.CharField(
        max_length=24,
        choices=DivergenceAction.choices,
        default=DivergenceAction.RECORD,
        help_text="What training that diverged while the job still runs leads to; it always "
        "waits for an operator's approval. A restart is proposed only when the job's last "
        "checkpoint was saved before the divergence began.",
    )
    progress_pattern = models.TextField(
        blank=True,
        help_text="Optional RE2 pattern with a named group 'step' replacing the built-in ones.",
    )
    checkpoint_pattern = models.TextField(
        blank=True, help_text="Optional RE2 pattern for checkpoint-saved lines."
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name_plural = "policies"

    def __str__(self) -> str:
        return self.name

    @property
    def specificity(self) -> int:
        return sum(bool(part) for part in (self.cluster_id, self.environment, self.partition))

    def clean(self) -> None:
        super().clean()
        errors: dict[str, str] = {}
        errors.update(
            _check_choice_list(
                "exclude_on_attributions",
                self.exclude_on_attributions,
                {a.value for a in Attribution if a != Attribution.NONE},
            )
        )
        errors.update(
            _check_choice_list(
                "keep_out_cluster_nodes",
                self.keep_out_cluster_nodes,
                {state.value for state in ClusterNodeState},
            )
        )
        errors.update(
            _check_choice_list(
                "exclude_on_categories",
                self.exclude_on_categories,
                {value for value, _ in SIGNATURE_CATEGORIES},
            )
        )
        if self.crash_action == RecommendationAction.RESTART_EXCLUDING and not (
            self.exclude_on_attributions or self.exclude_on_categories
        ):
            errors["crash_action"] = (
                "Restarting with exclusions needs at least one attribution or category "
                "whose nodes are excluded."
            )
        for field in ("progress_pattern", "checkpoint_pattern"):
            value = getattr(self, field)
            if not value:
                continue
            try:
                compiled = compile_linear(value)
            except PatternError as exc:
                errors[field] = str(exc)
                continue
            if field == "progress_pattern" and "step" not in compiled.groupindex:
                errors[field] = "The progress pattern needs a named group (?P<step>...)."
        if self.policy_with_same_scope().exists():
            errors["__all__"] = (
                "Another policy already has this cluster, environment and partition; "
                "edit that one instead."
            )
        if errors:
            raise ValidationError(errors)

    def policy_with_same_scope(self) -> models.QuerySet[Policy]:
        # filter(cluster_id=None) means IS NULL: a policy for every cluster matches only another.
        same_cluster = (
            Q(cluster__isnull=True) if self.cluster_id is None else Q(cluster_id=self.cluster_id)
        )
        return Policy.objects.filter(
            same_cluster, environment=self.environment, partition=self.partition
        ).exclude(pk=self.pk)


def _check_choice_list(field: str, value: object, allowed: set[str]) -> dict[str, str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        return {field: 'Give a list of names, e.g. ["hardware"].'}
    unknown = sorted(set(value) - allowed)
    if unknown:
        return {
            field: f"Unknown value(s): {', '.join(unknown)}. Allowed: {', '.join(sorted(allowed))}."
        }
    return {}
