"""The Slurm executor: how a restart and a stop are carried out on Slurm.

A restart of attempt N is done when Slurm's restart count has reached N, the excluded nodes are
set and the job is no longer held: requeue it held (or, where Slurm 25.11 offers it, requeue it
expedited), set its exclusions once it is pending, release it. A stop is done when further
requeue is disabled and the job has ended, and is not for this job any more once it was
requeued into a later attempt (nobody judged that one). Every step is decided from Slurm's
state read now (``Steps``), so a controller that takes over finishes what is left.

The one module of the controller that reads Slurm's job states (``native_state``).
"""

from __future__ import annotations

import logging

from recovery.controller.client import ReadyRecommendation
from recovery.controller.outcome import (
    SUBMIT_TIME_TOLERANCE,
    NotRestarted,
    Outcome,
    Retry,
    job_snapshot,
)
from recovery.controller.steps import Steps
from recovery.schedulers.base import Command, ExpeditedRequeueUnavailable, JobInfo, SchedulerError

logger = logging.getLogger(__name__)

FINISHED_STATES = frozenset(
    {
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "PREEMPTED",
    }
)
CANCELLED = "CANCELLED"


def started_since(recommendation: ReadyRecommendation, job: JobInfo) -> str | None:
    """Why the job's current allocation is not the attempt the recommendation is about.

    The restart count alone cannot tell a failed attempt N from attempt N's successor started by
    Slurm or a person while the recommendation waited: requeueing then would throw away a
    healthy new attempt. The job's start time must be the attempt's own.
    """
    if recommendation.attempt_started_at is None:
        return f"attempt {recommendation.attempt} never started, so there is nothing to restart"
    if job.start_time is None:
        raise Retry(f"the start time of job {job.job_id} is unknown")
    if job.start_time - recommendation.attempt_started_at > SUBMIT_TIME_TOLERANCE:
        return (
            f"job {job.job_id} started again at {job.start_time.isoformat()}, after attempt "
            f"{recommendation.attempt} (started {recommendation.attempt_started_at.isoformat()})"
        )
    return None


def restarted_past(recommendation: ReadyRecommendation, job: JobInfo) -> str | None:
    """Why a restart decided for attempt N has nothing left to do on the job as read, or None
    while it still has: the job not yet requeued, or requeued and still pending (this
    restart's own requeue, or Slurm's, waiting for its exclusions and release).

    Once attempt N+1 started, Slurm takes no exclusions until the job is pending again, and
    a later requeue (attempt N+2 or beyond) belongs to a later failure with a recommendation
    of its own: its hold is that one's, and releasing it, or setting this one's exclusions,
    would start the job without that one's.
    """
    attempt = recommendation.attempt
    assert attempt is not None and job.restart_count is not None  # checked as known
    if job.restart_count > attempt:
        return (
            f"job {job.job_id} is at attempt {job.restart_count + 1} ({job.native_state}): "
            f"restarted again after attempt {attempt + 1}, the restart this recommendation "
            "asked for"
        )
    if job.restart_count == attempt and not job.is_pending and job.native_state != "COMPLETING":
        missing = sorted(set(recommendation.excluded_nodes) - set(job.excluded_nodes or []))
        if missing:
            return (
                f"job {job.job_id} started attempt {attempt + 1} ({job.native_state}) without "
                f"excluding {', '.join(missing)}; Slurm takes exclusions only while a job is "
                "pending"
            )
    return None


def cancelled_since(job: JobInfo) -> str:
    """Why a cancelled job is not restarted: Slurm requeues a cancelled job that is still in
    memory, so a restart decided while the attempt ran or failed would bring back a job its
    owner, an administrator or a stop ended on purpose meanwhile. A failure never ends a job
    as CANCELLED (a crash is FAILED, a dead node NODE_FAIL, a time limit TIMEOUT): the policy
    leaves a cancelled job alone, and the controller keeps to that on the state it reads."""
    return f"job {job.job_id} was cancelled since the decision (scancel); a cancel is not undone"


def newer_attempt(recommendation: ReadyRecommendation, job: JobInfo) -> str | None:
    """Why a stop decided for attempt N is not this job's to carry out now.

    The decision was about attempt N's failure; when Slurm (its own requeue after a node
    failure, a preemption) or a person started attempt N+1 meanwhile, stopping would end an
    attempt nobody judged, maybe one that is training. Its own failure, if it comes, is decided
    afresh.
    """
    attempt = recommendation.attempt
    assert job.restart_count is not None  # checked as known
    if attempt is None or job.restart_count < attempt or job.native_state in FINISHED_STATES:
        return None
    return (
        f"job {job.job_id} is at attempt {job.restart_count + 1} ({job.native_state}), restarted "
        f"after attempt {attempt} that the stop was decided for"
    )


class SlurmExecutor:
    """Restart and stop on Slurm (and on the simulated Slurm, which speaks the same)."""

    def restart(
        self, steps: Steps, recommendation: ReadyRecommendation, job: JobInfo, outcome: Outcome
    ) -> None:
        attempt = recommendation.attempt
        if attempt is None:
            outcome.outcome = "failed"
            outcome.detail = "the recommendation names no attempt: cannot tell if it is done"
            return
        assert job.restart_count is not None and job.excluded_nodes is not None
        if job.restart_count < attempt and job.native_state == CANCELLED:
            outcome.converged = False
            outcome.detail = f"nothing restarted: {cancelled_since(job)}"
            return
        if job.restart_count < attempt and not job.requeue_allowed:
            outcome.outcome = "failed"
            outcome.converged = False
            outcome.detail = (
                f"abandoned: the job is {job.native_state} and Slurm will not requeue it"
            )
            return
        if job.restart_count < attempt and job.native_state == "COMPLETING":
            # Winding down: the failed attempt ending, or an allocation left over from a
            # restart. Which one shows once it has ended; until then nothing is done.
            job = steps.wait_for(job.job_id, lambda j: j.native_state != "COMPLETING")
            if job.native_state == "COMPLETING":
                raise Retry(f"job {job.job_id} is still completing")
        assert job.restart_count is not None and job.excluded_nodes is not None
        job_id = job.job_id
        moved_on = restarted_past(recommendation, job)
        if moved_on is not None:
            outcome.converged = set(recommendation.excluded_nodes) <= set(job.excluded_nodes)
            outcome.detail = f"nothing to do: {moved_on}"
            return
        requeue = job.restart_count < attempt and job.native_state != "PENDING"
        if requeue:
            problem = started_since(recommendation, job)
            if problem is not None:
                outcome.converged = False
                outcome.detail = f"nothing restarted: {problem}"
                return
        wanted_exclusions = sorted(set(job.excluded_nodes) | set(recommendation.excluded_nodes))
        missing_exclusions = not set(recommendation.excluded_nodes) <= set(job.excluded_nodes)
        if requeue:
            try:
                if not missing_exclusions and self._requeued_expedited(
                    steps, recommendation, job_id, outcome
                ):
                    missing_exclusions = False
                else:
                    steps.command(
                        outcome,
                        Command.REQUEUE_HOLD,
                        job_id,
                        lambda: steps.adapter.requeue(job_id, hold=True),
                        recheck=lambda: self._still_to_restart(steps, recommendation, job_id),
                    )
            except NotRestarted as exc:
                outcome.converged = False
                outcome.detail = f"nothing restarted: {exc}"
                return
            job = steps.wait_for(
                job_id,
                lambda j: (
                    j.native_state in {"PENDING", "COMPLETING"}
                    and (j.restart_count or 0) >= attempt
                ),
            )
        elif missing_exclusions and job.is_pending and not job.held:
            # Keep it from starting on an excluded node while the exclusion is set.
            steps.command(outcome, Command.HOLD, job_id, lambda: steps.adapter.hold(job_id))
        if missing_exclusions:
            self._exclude(steps, outcome, job_id, wanted_exclusions)
        current = steps.read_known(job_id)
        if current.held:
            steps.command(outcome, Command.RELEASE, job_id, lambda: steps.adapter.release(job_id))
        final = steps.read_job(job_id)
        outcome.converged = bool(
            final is not None
            and not final.unknown()
            and (final.restart_count or 0) >= attempt
            and set(recommendation.excluded_nodes) <= set(final.excluded_nodes or [])
            and final.held is False
            and final.native_state not in FINISHED_STATES
        )
        if not outcome.converged:
            reason = (
                "abandoned"
                if final is None or final.native_state in FINISHED_STATES
                else "not converged"
            )
            outcome.detail = outcome.detail or f"{reason}: {job_snapshot(final)}"

    def _requeued_expedited(
        self, steps: Steps, recommendation: ReadyRecommendation, job_id: str, outcome: Outcome
    ) -> bool:
        """Slurm 25.11's fast path, where the site and the job have it: restarted at once, at
        top priority, with no hold to lift. Nothing else to set, so nothing is lost by it.

        Where the job turns out not to have it, its dispatch stays in the trail with no command
        after it, and the ordinary requeue is dispatched next.
        """
        if not steps.adapter.supports_expedited_requeue():
            return False
        steps.keep_lease()
        try:
            steps.command(
                outcome,
                Command.REQUEUE_EXPEDITED,
                job_id,
                lambda: steps.adapter.requeue_expedited(job_id),
                recheck=lambda: self._still_to_restart(steps, recommendation, job_id),
            )
        except ExpeditedRequeueUnavailable as exc:
            logger.info("ordinary requeue for job %s: %s", job_id, exc)
            return False
        return True

    def _still_to_restart(
        self, steps: Steps, recommendation: ReadyRecommendation, job_id: str
    ) -> None:
        """Read the job once more after the requeue's dispatch, right before the requeue.

        A controller paused since it read the job (SIGSTOP, a frozen VM) may come back to an
        attempt that Slurm, a person or another controller restarted meanwhile; a second
        requeue would throw away that new attempt. Raises ``Retry`` when the job moved on (the
        next pass decides from its state) and ``NotRestarted`` when a newer attempt runs.
        """
        job = steps.read_known(job_id)
        attempt = recommendation.attempt
        assert attempt is not None and job.restart_count is not None  # checked as known
        if job.restart_count >= attempt or job.native_state in {"PENDING", "COMPLETING"}:
            raise Retry(
                f"job {job_id} changed since it was read (restart count {job.restart_count}, "
                f"{job.native_state}): not requeued"
            )
        if job.native_state == CANCELLED:
            raise NotRestarted(cancelled_since(job))
        problem = started_since(recommendation, job)
        if problem is not None:
            raise NotRestarted(problem)

    def _exclude(self, steps: Steps, outcome: Outcome, job_id: str, nodes: list[str]) -> None:
        """Set the exclusions; Slurm accepts them only once the requeued job is pending."""
        deadline = steps.clock() + steps.settle_seconds
        while True:
            steps.keep_lease()
            try:
                steps.command(
                    outcome,
                    Command.SET_EXCLUDED_NODES,
                    job_id,
                    lambda: steps.adapter.set_excluded_nodes(job_id, nodes),
                    nodes,
                )
                return
            except SchedulerError as exc:
                if "no longer pending" not in str(exc) or steps.clock() > deadline:
                    raise
            steps.sleep(steps.poll_seconds)

    def stop(
        self, steps: Steps, recommendation: ReadyRecommendation, job: JobInfo, outcome: Outcome
    ) -> None:
        job_id = job.job_id
        problem = newer_attempt(recommendation, job)
        if problem is not None:
            outcome.converged = False
            outcome.detail = f"nothing stopped: {problem}"
            return
        if job.native_state == "COMPLETING":
            # The failed attempt is still winding down; Slurm refuses updates until it ends.
            job = steps.wait_for(job_id, lambda j: j.native_state != "COMPLETING")
        if job.requeue_allowed and job.native_state not in FINISHED_STATES:
            try:
                steps.command(
                    outcome,
                    Command.DISABLE_REQUEUE,
                    job_id,
                    lambda: steps.adapter.disable_requeue(job_id),
                )
            except SchedulerError:
                current = steps.read_job(job_id)
                if current is None or current.native_state not in FINISHED_STATES:
                    raise
                job = current  # it ended meanwhile: nothing left that could restart it
        if job.native_state not in FINISHED_STATES:
            steps.command(outcome, Command.CANCEL, job_id, lambda: steps.adapter.cancel(job_id))
            job = steps.wait_for(job_id, lambda j: j.native_state in FINISHED_STATES)
        outcome.converged = job.native_state in FINISHED_STATES
