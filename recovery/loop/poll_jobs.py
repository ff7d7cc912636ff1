"""One listed job's workload and attempts, as a poll syncs them from the scheduler's word.

``poll`` decides which jobs are synced (ours, with every fact it needs, changed since the last
poll); this is what a sync of one of them writes: the workload's fields, its attempts (one for
each requeue, those nobody saw included, earlier ones closed), and the audit events of a state
change. Kept apart from the poll's order of steps, which it does not need to know.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Case, F, Q, Value, When
from django.db.models.functions import Coalesce

from recovery.audit.actors import Actor
from recovery.audit.record import record_event
from recovery.choices import AttemptExitState, AuditKind, WorkloadState
from recovery.loop.monitors import SchedulerEnding
from recovery.loop.workflows import workflow_of
from recovery.models import Attempt, Cluster, Workload
from recovery.schedulers.base import JobInfo
from recovery.schedulers.phase import HOLDS_ITS_NODES, Phase

WORKLOAD_STATES = {
    Phase.PENDING: WorkloadState.PENDING,
    Phase.RUNNING: WorkloadState.RUNNING,
    Phase.ENDING: WorkloadState.RUNNING,
    Phase.SUSPENDED: WorkloadState.RUNNING,
    Phase.COMPLETED: WorkloadState.COMPLETED,
    Phase.CANCELLED: WorkloadState.CANCELLED,
    Phase.FAILED: WorkloadState.FAILED,
    Phase.NODE_FAILED: WorkloadState.FAILED,
    Phase.TIMED_OUT: WorkloadState.FAILED,
    Phase.OUT_OF_MEMORY: WorkloadState.FAILED,
    # The scheduler hands a preempted job back to the queue (or ends it, which the next poll
    # shows as its ending).
    Phase.PREEMPTED: WorkloadState.REQUEUED,
}
ATTEMPT_ENDINGS = {
    Phase.COMPLETED: AttemptExitState.COMPLETED,
    Phase.FAILED: AttemptExitState.FAILED,
    Phase.NODE_FAILED: AttemptExitState.NODE_FAIL,
    Phase.TIMED_OUT: AttemptExitState.TIMEOUT,
    Phase.OUT_OF_MEMORY: AttemptExitState.OUT_OF_MEMORY,
    Phase.PREEMPTED: AttemptExitState.PREEMPTED,
    Phase.CANCELLED: AttemptExitState.CANCELLED,
}


# Requeues while nobody looked that get an attempt of their own (``_record_unseen_attempts``).
UNSEEN_ATTEMPTS_RECORDED = 50


WORK_DIR_LENGTH = 1024  # Workload.work_dir
# The jobs a workload keeps as the ones it waited for: a chain names one, rarely a few.
MAX_DEPENDS_ON = 16


def _sync_job(cluster: Cluster, job: JobInfo, now: datetime, digest: str) -> tuple[bool, bool, int]:
    """Upsert the job's workload and attempt; returns (created, state changed, workload id).

    An attempt this poll saw end abnormally keeps the scheduler's word on it
    (``Attempt.ending_to_judge``) for the monitors, once its output has been read.
    """
    workload = (
        Workload.objects.select_for_update()
        .filter(cluster=cluster, job_id=job.job_id)
        .order_by("-submit_time", "-id")
        .first()
    )
    created = False
    if workload is None or _is_another_job(workload, job):
        assert job.submit_time is not None  # a job with unknown facts is never synced
        workload = Workload.objects.create(
            cluster=cluster, job_id=job.job_id, submit_time=job.submit_time, state=""
        )
        created = True
    workload.name = job.name[:255]
    workload.user = job.user[:64]
    workload.partition = job.partition[:64]
    # Cut short it would name another account: one too long to keep binds nothing.
    workload.account = job.account if job.account and len(job.account) <= 64 else ""
    workload.opted_in = job.opt_in.opted_in
    workload.opt_in_error = job.opt_in.reason[:255]
    workload.opt_in_settings = job.opt_in.settings
    workload.environment = job.opt_in.environment or cluster.environment
    workload.opt_in_mode = job.opt_in.mode
    workload.workflow_ignored = job.opt_in.workflow_ignored[:255]
    # Kept once seen: Slurm stops showing a dependency when it is satisfied. Unknown adds none.
    for job_id in job.chained_after or ():
        if job_id not in workload.depends_on:
            workload.depends_on = [*workload.depends_on, job_id][-MAX_DEPENDS_ON:]
    workload.workflow = workflow_of(workload, job.opt_in.workflow)
    if job.stdout_path:
        workload.stdout_path = job.stdout_path[:1024]
    if job.stderr_path:
        workload.stderr_path = job.stderr_path[:1024]
    # Whose files the output may be, as the scheduler says now: an unknown uid reads nothing.
    workload.user_uid = job.user_uid
    if job.work_dir:
        # Cut short, it would name another directory: one too long to keep confines nothing.
        workload.work_dir = job.work_dir if len(job.work_dir) <= WORK_DIR_LENGTH else ""

    assert job.restart_count is not None
    number = job.restart_count + 1
    attempt, new_attempt = Attempt.objects.get_or_create(workload=workload, number=number)
    if new_attempt:
        # Only the poll makes attempts, so a gap below this one can only have opened now.
        _record_unseen_attempts(workload, number)
    if number > 1:
        _close_earlier_attempts(workload, number, now)
    was_running = attempt.exit_state == AttemptExitState.RUNNING
    _update_attempt(attempt, job)
    if (
        was_running
        and job.opt_in.opted_in
        and attempt.exit_state
        not in (AttemptExitState.RUNNING, AttemptExitState.COMPLETED, AttemptExitState.CANCELLED)
    ):
        Attempt.objects.filter(pk=attempt.pk).update(
            ending_to_judge=SchedulerEnding.of(job).to_json()
        )

    new_state = _workload_state(job)
    # The stop's own ending, as the scheduler shows it: the job stays stopped, and says why.
    kept_stopped = (
        workload.state == WorkloadState.STOPPED
        and number == workload.current_attempt
        and new_state in ENDED_STATES
    )
    if kept_stopped:
        new_state = WorkloadState.STOPPED
    changed = new_state != workload.state
    if changed:
        record_event(
            cluster=cluster,
            workload=workload,
            attempt=number,
            kind=AuditKind.STATE_CHANGED,
            actor=Actor.POLLER,
            payload={
                "from": workload.state,
                "to": new_state,
                "scheduler_state": job.native_state,
                "reason": job.reason,
                "restart_count": job.restart_count,
                "nodes": job.nodes,
            },
        )
        if new_state == WorkloadState.RUNNING and number > 1:
            record_event(
                cluster=cluster,
                workload=workload,
                attempt=number,
                kind=AuditKind.RESTART_ALLOCATED,
                actor=Actor.POLLER,
                payload={"nodes": job.nodes, "excluded_nodes": job.excluded_nodes},
            )
        if new_state == WorkloadState.COMPLETED:
            record_event(
                cluster=cluster,
                workload=workload,
                attempt=number,
                kind=AuditKind.TRAINING_COMPLETED,
                actor=Actor.POLLER,
                payload={"exit_code": job.exit_code},
            )
    workload.state = new_state
    if not kept_stopped:
        workload.state_reason = job.reason[:255]
    workload.current_attempt = number
    workload.synced_facts = digest
    workload.save()
    return created, changed, workload.pk


# What a stopped job's attempt looks like to the scheduler once it ended.
ENDED_STATES = frozenset({WorkloadState.FAILED, WorkloadState.CANCELLED, WorkloadState.COMPLETED})


def _is_another_job(workload: Workload, job: JobInfo) -> bool:
    """A job id Slurm handed out again: no restarts, and a submit time of its own.

    Only called with both facts read: an unknown restart count is not "no restarts".
    """
    if job.restart_count != 0 or job.submit_time is None:
        return False
    return abs(job.submit_time - workload.submit_time) > timedelta(seconds=1)


def _workload_state(job: JobInfo) -> str:
    # Only synced jobs come here, and a job with unknown facts (FACTS_FOR_SYNC) is never synced.
    assert job.phase is not None and job.restart_count is not None
    state = WORKLOAD_STATES.get(job.phase, WorkloadState.UNKNOWN)
    if state == WorkloadState.PENDING and job.held:
        return WorkloadState.HELD
    if state == WorkloadState.PENDING and job.restart_count > 0:
        return WorkloadState.REQUEUED
    return state


def _update_attempt(attempt: Attempt, job: JobInfo) -> None:
    assert job.phase is not None  # a job with unknown facts is never synced
    # Right after a requeue the job is still ending its previous allocation, with the
    # restart count already raised: until it starts again, its nodes and start time are the
    # previous attempt's.
    previous = (
        Attempt.objects.filter(workload=attempt.workload_id, number=attempt.number - 1)
        .only("started_at", "nodes")
        .first()
        if attempt.number > 1 and attempt.started_at is None
        else None
    )
    previous_start = previous.started_at if previous is not None else None
    started_anew = job.start_time is not None and (
        previous_start is None or job.start_time > previous_start
    )
    if attempt.number > 1 and attempt.started_at is None and job.phase == Phase.ENDING:
        # Slurm moves the start time at a requeue, before the old allocation has finished
        # completing: these are still the previous attempt's nodes, the only sight of them
        # when Slurm started and requeued it between two polls.
        started_anew = False
        if previous is not None and not previous.nodes and job.nodes:
            previous.nodes = job.nodes
            previous.save(update_fields=["nodes"])
    # Slurm forgets the nodes on requeue: keep them now. A job that ended still lists the
    # allocation it ended on, the only sight of it when the attempt started and ended between
    # two polls (what it printed names those nodes, and must be told from what the previous
    # attempt printed about its own).
    if job.nodes and job.phase in HOLDS_ITS_NODES and started_anew:
        attempt.nodes = job.nodes
    if job.excluded_nodes is not None:
        attempt.excluded_nodes = job.excluded_nodes
    if started_anew and job.phase != Phase.PENDING:
        attempt.started_at = attempt.started_at or job.start_time
    ending = ATTEMPT_ENDINGS.get(job.phase)
    if ending is not None:
        attempt.exit_state = ending
        attempt.ended_at = job.end_time or attempt.ended_at
        attempt.exit_code = job.exit_code if job.exit_code is not None else job.exit_signal
    attempt.save()


def _record_unseen_attempts(workload: Workload, number: int) -> None:
    """Attempts Slurm started and requeued while nobody looked: they ran, so they count.

    Slurm requeues a job itself (a node failed, it was preempted) and raises the restart
    count; when that happens between two polls (workers down, a slow database), or before the
    job is first seen, the count jumps. The attempts in between get rows of their own, ended
    and without nodes or start time (the scheduler no longer tells them), so that the retry
    budget counts them and what they printed has an attempt to be filed under: read with the
    current attempt's output, the previous attempt's node failure would otherwise be taken
    for the current one's and restart a healthy job. At most ``UNSEEN_ATTEMPTS_RECORDED``
    of them, the newest.
    """
    lowest = max(1, number - UNSEEN_ATTEMPTS_RECORDED)
    if number <= lowest:
        return
    known = set(
        Attempt.objects.filter(
            workload=workload, number__gte=lowest, number__lt=number
        ).values_list("number", flat=True)
    )
    missing = [n for n in range(lowest, number) if n not in known]
    if missing:
        Attempt.objects.bulk_create(
            [
                Attempt(workload=workload, number=n, exit_state=AttemptExitState.REQUEUED)
                for n in missing
            ],
            ignore_conflicts=True,  # the row lock on the workload makes this rare, not wrong
        )


def _close_earlier_attempts(workload: Workload, number: int, now: datetime) -> None:
    """Attempts before the current one ended when the job was requeued, whatever we saw."""
    Attempt.objects.filter(
        Q(ended_at__isnull=True) | Q(exit_state=AttemptExitState.RUNNING),
        workload=workload,
        number__lt=number,
    ).update(
        ended_at=Coalesce("ended_at", Value(now)),
        exit_state=Case(
            When(exit_state=AttemptExitState.RUNNING, then=Value(AttemptExitState.REQUEUED)),
            default=F("exit_state"),
        ),
    )
