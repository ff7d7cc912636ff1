from __future__ import annotations

import hashlib
from typing import Any

from django.db import models

from recovery.choices import AttemptExitState, OptInMode, WorkloadState
from recovery.models.cluster import Cluster
from recovery.models.workflow import Workflow


def canary_bucket(job_id: str) -> int:
    """0-99 from the job id alone: a job is in the same share of a canary on every poll, on
    every worker, and across its restarts (they keep the job id)."""
    digest = hashlib.sha256(str(job_id).encode()).digest()
    return int.from_bytes(digest[:4], "big") % 100


class Workload(models.Model):
    """One scheduler job, across all of its attempts.

    Identified by cluster, job id and submit time: Slurm reuses job ids after a wrap-around or
    a controller reset, and a new job must never inherit an old one's history.
    """

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="workloads")
    job_id = models.CharField(max_length=64)
    submit_time = models.DateTimeField()
    name = models.CharField(max_length=255, blank=True)
    user = models.CharField(max_length=64, blank=True)
    partition = models.CharField(max_length=64, blank=True)
    account = models.CharField(
        max_length=64,
        blank=True,
        help_text="The account the scheduler charges the job to; empty when it has none or "
        "it is unknown, and then no environment binding by account applies to the job.",
    )
    workflow = models.ForeignKey(
        Workflow,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="workloads",
        help_text="Groups related jobs of one user, e.g. a chain of submissions.",
    )
    workflow_ignored = models.CharField(
        max_length=255,
        blank=True,
        help_text="Why the workflow named in the job comment was not taken.",
    )
    depends_on = models.JSONField(
        default=list,
        blank=True,
        help_text="Job ids this job waited for with afterany or afternotok, as the scheduler "
        "showed them while it was pending (Slurm stops showing a dependency once satisfied).",
    )
    canary_bucket = models.PositiveSmallIntegerField(
        default=0,
        editable=False,
        help_text="0-99, from the job id: the job is in a canary of N % when this is below N.",
    )
    opted_in = models.BooleanField(default=False)
    opt_in_error = models.CharField(
        max_length=255, blank=True, help_text="Why the job comment did not opt the job in."
    )
    opt_in_settings = models.JSONField(default=dict, blank=True)
    environment = models.CharField(max_length=63, blank=True)
    opt_in_mode = models.CharField(
        max_length=16, choices=OptInMode.choices, default=OptInMode.OBSERVE
    )
    state = models.CharField(
        max_length=16, choices=WorkloadState.choices, default=WorkloadState.PENDING
    )
    state_reason = models.CharField(max_length=255, blank=True)
    current_attempt = models.PositiveIntegerField(default=0)
    last_progress_step = models.BigIntegerField(null=True, blank=True)
    last_progress_at = models.DateTimeField(null=True, blank=True)
    last_checkpoint_step = models.BigIntegerField(null=True, blank=True)
    last_checkpoint_at = models.DateTimeField(null=True, blank=True)
    # What the job has shown of its own quiet phases, for judging silence after an error.
    longest_quiet_seconds = models.FloatField(
        null=True,
        blank=True,
        help_text="The longest time between two progress steps of one attempt seen so far.",
    )
    quiet_phase = models.CharField(
        max_length=16,
        blank=True,
        help_text="A quiet phase the job announced after its last step (checkpoint, "
        "evaluation), until the next step.",
    )
    quiet_phase_at = models.DateTimeField(null=True, blank=True)
    stdout_path = models.CharField(max_length=1024, blank=True)
    stderr_path = models.CharField(max_length=1024, blank=True)
    work_dir = models.CharField(
        max_length=1024, blank=True, help_text="The job's working directory, as the scheduler says."
    )
    user_uid = models.PositiveBigIntegerField(
        null=True,
        blank=True,
        help_text="The uid the job runs as; its output files are read only when it owns them. "
        "Empty when the scheduler did not report it: then nothing is read.",
    )
    # A digest of the scheduler's facts this row was last synced from: a job whose facts did
    # not change since is not synced again (``recovery.loop.poll``).
    synced_facts = models.CharField(max_length=64, blank=True, editable=False)
    progress_checked_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="Last hang and straggler check."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-submit_time", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "job_id", "submit_time"], name="workload_identity"
            )
        ]
        indexes = [
            models.Index(fields=["cluster", "state"]),
        ]

    def __str__(self) -> str:
        label = f"{self.cluster.name}:{self.job_id}"
        return f"{label} {self.name}" if self.name else label

    def save(self, *args: Any, **kwargs: Any) -> None:
        self.canary_bucket = canary_bucket(self.job_id)
        update_fields = kwargs.get("update_fields")
        if update_fields is not None and "job_id" in update_fields:
            kwargs["update_fields"] = {*update_fields, "canary_bucket"}
        super().save(*args, **kwargs)

    @property
    def acts_automatically(self) -> bool:
        """Whether this job's recommendations may reach the scheduler without an approval.

        The cluster's mode must allow it, the job must be in the part of the cluster action
        mode reaches (``Cluster.in_action_scope``: a canary), and the job's owner must have
        asked for "act": a job opted in to be observed waits for an operator whatever the
        cluster's mode.
        """
        return (
            self.cluster.acts_automatically
            and self.in_action_scope
            and self.opted_in
            and self.opt_in_mode == OptInMode.ACT
        )

    @property
    def in_action_scope(self) -> bool:
        """In the cluster's canary, or the cluster has none (the mode aside)."""
        return self.cluster.in_action_scope(self.partition, self.canary_bucket)


class Attempt(models.Model):
    """One allocation of a workload: the first run or a restart."""

    workload = models.ForeignKey(Workload, on_delete=models.CASCADE, related_name="attempts")
    number = models.PositiveIntegerField()
    nodes = models.JSONField(default=list, blank=True, help_text="Node names, expanded.")
    excluded_nodes = models.JSONField(default=list, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    exit_state = models.CharField(
        max_length=16, choices=AttemptExitState.choices, default=AttemptExitState.RUNNING
    )
    exit_code = models.IntegerField(null=True, blank=True)
    produced_checkpoint = models.BooleanField(default=False)
    # How the scheduler said the attempt ended, until the monitors have judged it after the
    # attempt's output was read (``recovery.loop.workloads``): kept here, a worker killed in
    # between leaves it for the next one.
    ending_to_judge = models.JSONField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["workload", "number"]
        constraints = [
            models.UniqueConstraint(fields=["workload", "number"], name="attempt_number_unique")
        ]

    def __str__(self) -> str:
        return f"{self.workload} attempt {self.number}"


class LogCursor(models.Model):
    """How far a workload's output file has been read, so each byte is scanned once."""

    workload = models.ForeignKey(Workload, on_delete=models.CASCADE, related_name="log_cursors")
    path = models.CharField(max_length=1024)
    offset = models.BigIntegerField(default=0)
    truncations = models.PositiveIntegerField(
        default=0, help_text="Times the file shrank: a restart that did not append."
    )
    # Non-finite losses counted so far, per rank, carried from one read to the next
    # (``LogScanner``'s ``nonfinite_state``).
    nonfinite_streaks = models.JSONField(default=dict, blank=True, editable=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["workload", "path"], name="log_cursor_unique")
        ]

    def __str__(self) -> str:
        return f"{self.path}@{self.offset}"


class ProgressSample(models.Model):
    """A progress line seen in a workload's output: the step a rank or node reached, and when.

    Kept for a bounded window per workload; the hang and straggler detectors read them.
    """

    workload = models.ForeignKey(
        Workload, on_delete=models.CASCADE, related_name="progress_samples"
    )
    attempt = models.PositiveIntegerField()
    rank = models.IntegerField(null=True, blank=True)
    node = models.CharField(max_length=128, blank=True)
    step = models.BigIntegerField()
    # The loss the line printed, when finite (a NaN is counted by the log scanner instead).
    loss = models.FloatField(null=True, blank=True)
    throughput = models.FloatField(null=True, blank=True)
    step_time_seconds = models.FloatField(null=True, blank=True)
    at = models.DateTimeField()

    class Meta:
        ordering = ["workload", "at", "id"]
        indexes = [
            models.Index(fields=["workload", "attempt", "at"]),
            models.Index(fields=["workload", "at"]),
        ]

    def __str__(self) -> str:
        return f"{self.workload} step {self.step} at {self.at:%H:%M:%S}"
