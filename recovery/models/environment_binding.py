from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q

from recovery.models.cluster import Cluster
from recovery.schedulers.optin import MAX_ENVIRONMENT_LENGTH
from recovery.schedulers.validation import name_problem

SAYS_WHICH_JOBS = (
    "Say which jobs may choose this environment: a partition, an account or both, or any job "
    "on the cluster (then neither)."
)


class EnvironmentBinding(models.Model):
    """Which jobs may choose an environment's policy for what reaches beyond their own job.

    A job names its environment in its comment, and that environment's policy governs the
    job's own recovery: its restarts, retry budget, hang and straggler settings, the nodes its
    own next attempt avoids. Effects on nodes and on other users' jobs (nodes excluded on the
    cluster, suspects, drains, the blast radius) follow the cluster's policy, unless a binding
    here lets the job's partition or account choose the environment. The operator says which
    jobs may; a job cannot. Read by ``recovery.loop.policy.site_policy``.
    """

    cluster = models.ForeignKey(
        Cluster, on_delete=models.CASCADE, related_name="environment_bindings"
    )
    environment = models.CharField(
        max_length=MAX_ENVIRONMENT_LENGTH, help_text="As jobs name it in their comment."
    )
    partition = models.CharField(
        max_length=64,
        blank=True,
        help_text="Jobs running on this partition. Empty: any partition of the given account.",
    )
    account = models.CharField(
        max_length=64,
        blank=True,
        help_text="Jobs charged to this account, as the scheduler reports it. Empty: any "
        "account on the given partition. With both, a job needs both.",
    )
    any_job = models.BooleanField(
        default=False,
        verbose_name="any job on the cluster",
        help_text="Every job on the cluster may choose this environment for effects on nodes "
        "and other jobs. Partition and account stay empty.",
    )
    note = models.CharField(max_length=255, blank=True, help_text="Why, for the next person.")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["cluster", "environment", "partition", "account"]
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "environment", "partition", "account"],
                name="environment_binding_scope",
                violation_error_message="This cluster already binds this environment to the "
                "same partition and account; edit that binding instead.",
            ),
            models.CheckConstraint(
                condition=Q(any_job=True, partition="", account="")
                | (Q(any_job=False) & (~Q(partition="") | ~Q(account=""))),
                name="environment_binding_says_which_jobs",
                violation_error_message=SAYS_WHICH_JOBS,
            ),
        ]

    def __str__(self) -> str:
        return f"{self.environment} on {self.cluster.name}: {self.jobs}"

    @property
    def jobs(self) -> str:
        """The jobs bound, in words: "partition prod, account physics"."""
        if self.any_job:
            return "any job"
        parts = [f"partition {self.partition}"] if self.partition else []
        parts += [f"account {self.account}"] if self.account else []
        return ", ".join(parts)

    def covers(self, partition: str, account: str) -> bool:
        """Whether a job on ``partition`` charged to ``account`` ("" when it has none or it
        is unknown) may choose this environment."""
        if self.any_job:
            return True
        if not (self.partition or self.account):
            return False  # says no jobs: refused by the constraint, never read as "any"
        return (not self.partition or self.partition == partition) and (
            not self.account or self.account == account
        )

    def clean(self) -> None:
        super().clean()
        errors: dict[str, str] = {}
        for field, max_length in (
            ("environment", MAX_ENVIRONMENT_LENGTH),
            ("partition", 64),
            ("account", 64),
        ):
            value = getattr(self, field)
            problem = name_problem(value, max_length=max_length) if value else None
            if problem:
                errors[field] = f"This name {problem}."
        if errors:
            raise ValidationError(errors)
