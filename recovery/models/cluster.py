from __future__ import annotations

import re
from datetime import datetime

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from recovery.choices import (
    DRAIN_REASON_PREFIX,
    ClusterMode,
    Connection,
    NodeHealth,
    SchedulerKind,
)
from recovery.schedulers.base import (
    NodeInfo,
    describe_unknown,
    drain_refusal,
    drained_by_recovery,
    resume_refusal,
)

PARTITION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
MAX_ACTION_PARTITIONS = 100


def validate_partition_list(value: object) -> None:
    """A canary's partitions: a list of at most 100 distinct Slurm partition names."""
    if not isinstance(value, list):
        raise ValidationError('A list of partition names, e.g. ["canary"].')
    if len(value) > MAX_ACTION_PARTITIONS:
        raise ValidationError(f"At most {MAX_ACTION_PARTITIONS} partitions.")
    for name in value:
        if not isinstance(name, str) or not PARTITION_NAME.match(name):
            raise ValidationError(
                f"{name!r} is not a partition name: letters, digits, '.', '_' or '-', starting "
                "with a letter or digit (at most 64)."
            )
    if len(set(value)) != len(value):
        raise ValidationError("A partition is listed twice.")


cluster_name_validator = RegexValidator(
    r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$",
    "Use letters, digits, '.', '_' or '-', starting with a letter or digit (at most 63).",
)


class Cluster(models.Model):
    """A scheduler the system watches, and how far it may act on it."""

    name = models.CharField(max_length=63, unique=True, validators=[cluster_name_validator])
    scheduler_kind = models.CharField(
        max_length=16, choices=SchedulerKind.choices, default=SchedulerKind.SLURM
    )
    connection = models.CharField(
        max_length=16, choices=Connection.choices, default=Connection.LOCAL
    )
    connection_settings = models.JSONField(
        default=dict,
        blank=True,
        help_text="Transport details, e.g. SSH host, port, user and known_hosts file.",
    )
    mode = models.CharField(
        max_length=16,
        choices=ClusterMode.choices,
        default=ClusterMode.MONITOR,
        help_text="New clusters start in monitor mode: nothing acts without an approval.",
    )
    acknowledge_scheduler_actions = models.BooleanField(
        default=False,
        help_text="Action mode executes automatically only when this is also set.",
    )
    drain_automatically = models.BooleanField(
        default=False,
        help_text="Drain recommendations (a node with a hardware verdict from its kernel log, "
        "DCGM or the scheduler) run without an approval, and only where the cluster acts "
        "automatically. Off: every drain waits for an operator, even in action mode.",
    )
    action_partitions = models.JSONField(
        default=list,
        blank=True,
        validators=[validate_partition_list],
        help_text="A canary: in action mode, only jobs in these partitions are acted on without "
        "an approval; the rest of the cluster stays in monitor mode. Empty: every partition.",
    )
    action_share_percent = models.PositiveSmallIntegerField(
        default=100,
        validators=[MinValueValidator(1), MaxValueValidator(100)],
        help_text="A canary: in action mode, only this share of opted-in jobs (chosen by job "
        "id, the same jobs every time) is acted on without an approval. 100: every job.",
    )
    environment = models.CharField(
        max_length=63, blank=True, help_text="Label such as prod or staging, used by policies."
    )
    last_polled_at = models.DateTimeField(null=True, blank=True)
    last_poll_error = models.CharField(
        max_length=500, blank=True, help_text="Why the last poll failed; empty once one succeeds."
    )
    last_poll_error_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def is_polled(self) -> bool:
        """Whether a scheduler stands behind the cluster: Slurm, or a running simulation.

        The demo's recorded history clusters are simulated without a simulator: nothing to poll.
        """
        if self.connection != Connection.SIMULATED:
            return True
        simulator = (self.connection_settings or {}).get("simulator")
        return isinstance(simulator, dict) and "name" in simulator

    @property
    def acts_automatically(self) -> bool:
        """Whether a recommendation may reach the scheduler without an operator's approval."""
        return self.mode == ClusterMode.ACTION and self.acknowledge_scheduler_actions

    @property
    def drains_without_approval(self) -> bool:
        """Whether the policy's drains run without an operator: acting on its own, automatic
        drains on, and no canary (a drain takes a node from every partition it serves)."""
        return self.acts_automatically and self.drain_automatically and not self.has_canary

    @property
    def has_canary(self) -> bool:
        """Action mode reaches only part of the cluster: chosen partitions or a share of jobs."""
        return bool(self.action_partitions) or self.action_share_percent < 100

    def in_action_scope(self, partition: str, canary_bucket: int) -> bool:
        """Whether a job of ``partition`` with ``canary_bucket`` is in the part of the cluster
        that action mode reaches (the canary), the mode itself aside. Both settings narrow."""
        partitions = self.action_partitions or []
        return (not partitions or partition in partitions) and (
            canary_bucket < self.action_share_percent
        )

    def acts_without_approval(self) -> str:
        """What the policy's recommendations may do here without an approval, for people."""
        if not self.acts_automatically:
            return "nothing (monitor mode, or action mode not acknowledged)"
        if not self.has_canary:
            return "every opted-in job"
        return f"jobs in {self.action_scope_words()}"

    def action_scope_words(self) -> str:
        """The part of the cluster action mode reaches, for people."""
        parts = []
        if self.action_partitions:
            parts.append("partition " + ", ".join(map(str, self.action_partitions)))
        if self.action_share_percent < 100:
            parts.append(f"{self.action_share_percent} % of jobs")
        return " and ".join(parts) or "every job"


def scheduler_cluster_name(cluster: Cluster) -> str:
    """The name the cluster's scheduler calls itself (Slurm's ``ClusterName``).

    Set as ``scheduler_cluster_name`` in the connection settings where it differs from the
    cluster's name here.
    """
    settings = cluster.connection_settings or {}
    return str(settings.get("scheduler_cluster_name") or cluster.name)


class NodeQuerySet(models.QuerySet["Node"]):
    def excluded(self, at: datetime | None = None) -> NodeQuerySet:
        """The nodes recovery keeps restarts off at ``at`` (now unless told)."""
        return self.filter(Node.excluded_at(at or timezone.now()))

    def not_excluded(self, at: datetime | None = None) -> NodeQuerySet:
        """The nodes restarts may use at ``at``: never excluded, or no longer."""
        return self.exclude(Node.excluded_at(at or timezone.now()))


class Node(models.Model):
    """A compute node as the scheduler reports it, plus what recovery has learnt about it."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="nodes")
    name = models.CharField(max_length=128)
    # The state as the last poll read it, base state first (``IDLE+DRAIN``); "" when unknown.
    scheduler_state = models.CharField(max_length=255, blank=True)
    state_flags = models.JSONField(
        default=list,
        blank=True,
        help_text="Every flag of the state as the last poll read it (DRAIN, NOT_RESPONDING...).",
    )
    state_reason = models.CharField(max_length=255, blank=True)
    reason_set_by = models.CharField(
        max_length=64, blank=True, help_text="Who set the reason, where the scheduler says."
    )
    reason_set_at = models.DateTimeField(
        null=True, blank=True, help_text="When the reason was set, where the scheduler says."
    )
    unreadable = models.JSONField(
        default=dict,
        blank=True,
        help_text="What the last poll could not read of the node, and why. With its state or "
        "reason unknown, recovery neither drains nor resumes the node.",
    )
    health = models.CharField(max_length=16, choices=NodeHealth.choices, default=NodeHealth.UNKNOWN)
    times_implicated = models.PositiveIntegerField(default=0)
    last_implicated_at = models.DateTimeField(null=True, blank=True)
    excluded_until = models.DateTimeField(null=True, blank=True)
    suspect_since = models.DateTimeField(
        null=True,
        blank=True,
        help_text="Implicated in several workloads within the policy's window: a hint to the "
        "health layer (test it); only a hardware verdict from a site fact leads to a drain.",
    )
    suspect_reason = models.CharField(max_length=255, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = NodeQuerySet.as_manager()

    class Meta:
        ordering = ["cluster", "name"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="node_unique_per_cluster")
        ]
        # The nodes a decision's facts hold (``cluster_node_facts``), each found by its own.
        indexes = [
            models.Index(fields=["cluster", "excluded_until"], name="node_excluded_until"),
            models.Index(
                fields=["cluster", "health", "last_implicated_at"], name="node_health_implicated"
            ),
            models.Index(fields=["cluster", "suspect_since"], name="node_suspect_since"),
        ]

    def __str__(self) -> str:
        return f"{self.cluster.name}/{self.name}"

    @property
    def drained_by_recovery(self) -> bool:
        """Read as drained with recovery's own reason: the only drains recovery resumes."""
        return drained_by_recovery(self.as_read())

    @property
    def state_unknown(self) -> str:
        """Why the last poll could not tell the node's state or reason, or "" when it could."""
        return describe_unknown(self.as_read().unknown())

    @property
    def drain_refusal(self) -> str:
        """Why recovery may not drain the node as last read, or "" (``base.drain_refusal``)."""
        return drain_refusal(self.as_read())

    @property
    def resume_refusal(self) -> str:
        """Why recovery may not resume the node as last read, or "" (``base.resume_refusal``)."""
        return resume_refusal(self.as_read())

    def as_read(self) -> NodeInfo:
        """The node as the last poll read it, for the rules recovery drains and resumes by.

        The flags are those of ``state_flags`` and any after the base state in
        ``scheduler_state`` (rows written before ``state_flags`` existed have only those). A
        node never read, or whose state the poll could not read, has no known state.
        """
        words = [word for word in self.scheduler_state.upper().split("+") if word]
        unreadable = {str(key): str(why) for key, why in (self.unreadable or {}).items()}
        state = words[0] if words and "state" not in unreadable else None
        if state is None:
            unreadable.setdefault("state", "not read yet")
        flags = [*words[1:], *(str(flag).upper() for flag in self.state_flags or [])]
        return NodeInfo(
            name=self.name,
            state=state,
            flags=list(dict.fromkeys(flags)),
            reason=None if "reason" in unreadable else self.state_reason,
            reason_set_by=self.reason_set_by,
            reason_set_at=self.reason_set_at,
            unreadable=unreadable,
        )

    @staticmethod
    def drained_by_recovery_condition() -> Q:
        """``drained_by_recovery`` as a query condition, for filters and counts."""
        return Q(state_reason__startswith=DRAIN_REASON_PREFIX) & (
            Q(scheduler_state__icontains="drain") | Q(scheduler_state__icontains="drng")
        )

    def is_excluded(self, at: datetime | None = None) -> bool:
        at = at or timezone.now()
        return self.excluded_until is not None and self.excluded_until > at

    @staticmethod
    def excluded_at(at: datetime) -> Q:
        """``is_excluded`` as a query condition, for filters and counts
        (``Count("id", filter=Node.excluded_at(now))``)."""
        return Q(excluded_until__gt=at)


class NodeLogCursor(models.Model):
    """How far a node's kernel log (syslog or dmesg file) has been read."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="log_cursors")
    path = models.CharField(max_length=1024)
    offset = models.BigIntegerField(default=0)
    truncations = models.PositiveIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["node", "path"], name="node_log_cursor_unique")
        ]

    def __str__(self) -> str:
        return f"{self.node}: {self.path}@{self.offset}"
