"""Workflows for the Console: the list, and one workflow's jobs on one timeline.

Every query is bounded: a workflow's page shows its newest jobs, their newest attempts and
anomalies, however long the workflow has been going.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, Max, QuerySet
from django.utils import timezone

from recovery.models import Anomaly, Attempt, Workflow, Workload

MAX_WORKFLOW_JOBS = 40
MAX_WORKFLOW_ATTEMPT_ROWS = 60
MAX_WORKFLOW_ANOMALIES = 500


def workflow_rows(workflows: QuerySet[Workflow]) -> QuerySet[Workflow]:
    """Workflows with their number of jobs and newest submission, most recently active first."""
    return (
        workflows.select_related("cluster")
        .annotate(jobs_count=Count("workloads"), last_submitted=Max("workloads__submit_time"))
        .order_by("-last_submitted", "-id")
    )


@dataclass
class WorkflowTimelineData:
    """A workflow's newest jobs with their attempts and anomalies, oldest job first."""

    workflow: Workflow
    now: datetime
    jobs: list[Workload]
    older_jobs_hidden: bool
    # Each job's attempts, the job's first attempt first; the newest rows when there are many.
    attempts: list[Attempt]
    older_attempts_hidden: bool
    anomalies: list[Anomaly]


def load_workflow_timeline(
    workflow: Workflow, *, now: datetime | None = None
) -> WorkflowTimelineData:
    """What the workflow's timeline shows, in four bounded queries."""
    now = now or timezone.now()
    jobs = list(
        workflow.workloads.select_related("cluster").order_by("-submit_time", "-id")[
            : MAX_WORKFLOW_JOBS + 1
        ]
    )
    older_jobs_hidden = len(jobs) > MAX_WORKFLOW_JOBS
    jobs = jobs[:MAX_WORKFLOW_JOBS][::-1]
    by_id = {job.pk: job for job in jobs}
    attempts = list(
        Attempt.objects.filter(workload__in=list(by_id)).order_by(
            "-workload__submit_time", "-workload_id", "-number"
        )[: MAX_WORKFLOW_ATTEMPT_ROWS + 1]
    )
    older_attempts_hidden = len(attempts) > MAX_WORKFLOW_ATTEMPT_ROWS
    attempts = attempts[:MAX_WORKFLOW_ATTEMPT_ROWS][::-1]
    for attempt in attempts:
        attempt.workload = by_id[attempt.workload_id]
    anomalies = list(
        Anomaly.objects.filter(workload__in=list(by_id))
        .select_related("attempt")
        .order_by("-detected_at", "-id")[:MAX_WORKFLOW_ANOMALIES]
    )
    for anomaly in anomalies:
        anomaly.workload = by_id[anomaly.workload_id]
    return WorkflowTimelineData(
        workflow=workflow,
        now=now,
        jobs=jobs,
        older_jobs_hidden=older_jobs_hidden,
        attempts=attempts,
        older_attempts_hidden=older_attempts_hidden,
        anomalies=anomalies,
    )
