"""Which workflow a job belongs to, decided when the poll syncs it (step 2 of the loop).

A workflow is named by its jobs' owner: a ``workflow`` key in the opt-in comment, or a Slurm
dependency (``afterany``/``afternotok``) on an earlier job of the same user, which the scheduler
shows only while the job is pending. A named workflow wins over a dependency. The jobs of a
workflow share one retry budget and the nodes their attempts excluded
(``recovery.loop.policy.history_of``); a workflow is always one user's on one cluster, so a
job never inherits another user's budget or exclusions, whatever it names or depends on.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import IntegrityError, transaction

from recovery.loop.policy import history_of, policy_for
from recovery.models import Workflow, Workload

# A chain of dependent jobs without a name is named after its first job and that job's submit
# time: job ids wrap around, and a chain must never join an old one that had the same first id.
CHAIN_NAME = "chain-{job_id}-{submitted:%Y%m%d%H%M%S}"


def workflow_of(workload: Workload, named: str) -> Workflow | None:
    """The workflow ``workload`` belongs to: the one it names, else its dependency's, else the
    one it is in already, if any.

    ``workload.depends_on`` holds the job ids it waited for, as recorded while it was pending.
    Of the jobs the cluster knows from the same user, the earliest one in a workflow decides:
    that workflow is joined. When none is in one, the earliest starts a chain with this job.
    """
    if not workload.user:
        return None  # nobody's workflow: the poll never syncs a job of an unknown user
    if named:
        return _get_or_create(workload, named)
    earlier = _earlier_job(workload)
    if earlier is None:
        # A chain's first job was put in the chain by the job after it, and a name once taken
        # is not dropped by a comment edited since: only another name moves a job.
        return workload.workflow if workload.workflow_id is not None else None
    if earlier.workflow_id is not None:
        return earlier.workflow
    chain = _get_or_create(
        workload, CHAIN_NAME.format(job_id=earlier.job_id, submitted=earlier.submit_time)
    )
    Workload.objects.filter(pk=earlier.pk, workflow__isnull=True).update(workflow=chain)
    return chain


def _earlier_job(workload: Workload) -> Workload | None:
    """The job ``workload`` depends on: the same user's, on the same cluster, submitted before.

    A job id may have been handed out again since: the newest job of that id submitted before
    this one is the one Slurm meant.
    """
    job_ids = [job_id for job_id in workload.depends_on or [] if isinstance(job_id, str)]
    if not job_ids:
        return None
    candidates = (
        Workload.objects.filter(
            cluster_id=workload.cluster_id,
            user=workload.user,
            job_id__in=job_ids,
            submit_time__lte=workload.submit_time,
        )
        .exclude(pk=workload.pk)
        .select_related("workflow")
        .order_by("-submit_time", "-id")
    )
    newest: dict[str, Workload] = {}
    for candidate in candidates:
        newest.setdefault(candidate.job_id, candidate)
    return min(
        newest.values(),
        key=lambda job: (job.workflow_id is None, job.submit_time, job.pk),
        default=None,
    )


def _get_or_create(workload: Workload, name: str) -> Workflow:
    identity = {"cluster_id": workload.cluster_id, "user": workload.user, "name": name}
    found = Workflow.objects.filter(**identity).first()
    if found is not None:
        return found
    try:
        with transaction.atomic():
            return Workflow.objects.create(**identity)
    except IntegrityError:
        # Another worker created it this instant: it is the same workflow.
        return Workflow.objects.get(**identity)


@dataclass(frozen=True)
class WorkflowBudget:
    """What the policy sees of a workflow at its newest job: the budget used and left, and the
    nodes its jobs' restarts keep out (the cluster's own exclusions aside)."""

    policy: str
    attempts: int
    max_attempts: int
    attempts_without_checkpoint: int
    max_attempts_without_checkpoint: int
    excluded_nodes: list[str]

    @property
    def attempts_left(self) -> int:
        return max(self.max_attempts - self.attempts, 0)

    @property
    def attempts_without_checkpoint_left(self) -> int:
        return max(self.max_attempts_without_checkpoint - self.attempts_without_checkpoint, 0)


def workflow_budget(workflow: Workflow) -> WorkflowBudget | None:
    """The budget as the policy counts it for the workflow's newest job; None without jobs."""
    newest = (
        Workload.objects.filter(workflow=workflow)
        .select_related("cluster")
        .order_by("-submit_time", "-id")
        .first()
    )
    if newest is None:
        return None
    policy = policy_for(newest)
    history = history_of(newest, policy)
    return WorkflowBudget(
        policy=policy.name,
        attempts=history.attempts,
        max_attempts=policy.max_attempts,
        attempts_without_checkpoint=history.attempts_without_checkpoint,
        max_attempts_without_checkpoint=policy.max_attempts_without_checkpoint,
        excluded_nodes=sorted(history.previously_excluded),
    )
