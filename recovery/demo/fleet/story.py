"""One demo story: a workload's history, told in time order.

A story runs in its own time. What a job does by itself (starting, training, saving
checkpoints, ending, being requeued) is written by the story as the poller and the progress
reader would record it; everything the loop decides is left to the loop's own functions,
called with the clock set to the moment it happens: findings are recorded, attributed and
decided by ``recovery.loop.anomalies.record_anomalies``, suspects settled by
``recovery.loop.monitors.check_suspects``, operator decisions and controller claims and reports
go through ``recovery.loop.recommendations``, holds and deadlines through
``recovery.loop.watchdog``. The story's own writes wait in a queue and are written in time
order as its clock passes them, so the trail reads in order and each loop call sees the
workload as it was at that moment.

The builder (``builder``) only opens a story and counts what it wrote; what a story hands the
loop in place of a real cluster is in ``stand_ins``.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from recovery.audit.actors import Actor
from recovery.audit.record import record_event
from recovery.choices import AttemptExitState, AuditKind, WorkloadState
from recovery.controller.outcome import job_snapshot
from recovery.demo.fleet.clock import story_clock
from recovery.demo.fleet.parts import Evidence, Pace, Progress, Run
from recovery.demo.fleet.stand_ins import _HeldJob, demo_evidence_source
from recovery.loop import recommendations as decisions
from recovery.loop.anomalies import record_anomalies
from recovery.loop.monitors import check_suspects
from recovery.loop.watchdog import expire_stale_recommendations, release_if_overdue
from recovery.models import Anomaly, Attempt, Recommendation, Workload
from recovery.schedulers.base import JobInfo
from recovery.schedulers.optin import OptIn
from recovery.schedulers.slurm_phase import slurm_phase

if TYPE_CHECKING:
    from recovery.demo.fleet.builder import Builder

LEASE_SECONDS = 120
# The demo's one controller process, as the instance id it would make at start.
DEMO_CONTROLLER_INSTANCE = "5f1c7a0e-2d4b-4e8a-9c31-7b6d0a2e9f45"


class Story:
    """One workload's history, told in time order."""

    def __init__(self, builder: Builder, workload: Workload, controller: str) -> None:
        self.b = builder
        self.rng = builder.rng
        self.workload = workload
        self.cluster = workload.cluster
        self.controller = controller
        self._queue: list[tuple[datetime, int, Callable[[], None]]] = []
        self._queued = 0
        self._clock: datetime = workload.submit_time

    @property
    def job(self) -> str:
        return self.workload.job_id

    # the story's clock

    def later(self, at: datetime, write: Callable[[], None]) -> None:
        """Write with ``write`` once the story's clock reaches ``at``."""
        if at < self._clock:
            raise ValueError(f"job {self.job}: {at} is before the story's clock, {self._clock}")
        heapq.heappush(self._queue, (at, self._queued, write))
        self._queued += 1

    @contextmanager
    def at(self, when: datetime) -> Iterator[None]:
        """Within the block it is ``when``: what the story queued before then is written.

        The loop is called in time order only: a call that would go back in time is a
        defect of the story, and would leave the trail out of order.
        """
        if when < self._clock:
            raise ValueError(f"job {self.job}: {when} is before {self._clock}")
        self._clock = when
        self._write_until(when)
        with story_clock(when):
            yield

    def flush(self) -> None:
        """Write what is still queued: the story is over."""
        self._write_until(None)

    def _write_until(self, when: datetime | None) -> None:
        while self._queue and (when is None or self._queue[0][0] <= when):
            at, _, write = heapq.heappop(self._queue)
            with story_clock(at):
                write()

    def event(
        self, kind: str, actor: str, at: datetime, attempt: int | None, **payload: Any
    ) -> None:
        """An event the poller or the progress reader records at ``at``."""

        def write() -> None:
            record_event(
                cluster=self.cluster,
                workload=self.workload,
                attempt=attempt,
                kind=kind,
                actor=actor,
                payload=payload,
                occurred_at=at,
            )

        self.later(at, write)

    def state(
        self,
        at: datetime,
        attempt: int,
        new: str,
        scheduler_state: str,
        *,
        reason: str = "",
        nodes: Sequence[str] = (),
    ) -> None:
        """At ``at`` the poller sees the job in ``scheduler_state``: the workload is ``new``."""

        def write() -> None:
            workload = self.workload
            record_event(
                cluster=self.cluster,
                workload=workload,
                attempt=attempt,
                kind=AuditKind.STATE_CHANGED,
                actor=Actor.POLLER,
                payload={
                    "from": workload.state,
                    "to": new,
                    "scheduler_state": scheduler_state,
                    "reason": reason,
                    "restart_count": attempt - 1,
                    "nodes": list(nodes),
                },
                occurred_at=at,
            )
            workload.state = new
            workload.state_reason = reason
            workload.current_attempt = attempt
            workload.save(update_fields=["state", "state_reason", "current_attempt", "updated_at"])

        self.later(at, write)

    def finish(
        self, state: str, attempt: int, progress: Progress | None = None, reason: str = ""
    ) -> None:
        """The workload's state, attempt and progress as the story leaves them."""

        def write() -> None:
            workload = self.workload
            workload.state = state
            workload.state_reason = reason
            workload.current_attempt = attempt
            if progress is not None:
                workload.last_progress_step = progress.step
                workload.last_progress_at = progress.at
                workload.last_checkpoint_step = progress.checkpoint_step
                workload.last_checkpoint_at = progress.checkpoint_at
            workload.save()

        self.later(self.b.now, write)

    # attempts and training progress

    def start(self, nodes: Sequence[str], after_submit: timedelta) -> Run:
        """The first attempt starts running on ``nodes``, ``after_submit`` the submission."""
        at = self.workload.submit_time + after_submit
        self.state(at, 1, WorkloadState.RUNNING, "RUNNING", nodes=nodes)
        return Run(self._attempt(1, nodes, at), nodes, at)

    def restart(
        self, number: int, nodes: Sequence[str], at: datetime, *, excluded: Sequence[str] = ()
    ) -> Run:
        """Attempt ``number`` is allocated ``nodes`` at ``at``, with ``excluded`` kept out."""
        self.state(at, number, WorkloadState.RUNNING, "RUNNING", nodes=nodes)
        self.event(
            AuditKind.RESTART_ALLOCATED,
            Actor.POLLER,
            at,
            number,
            nodes=list(nodes),
            excluded_nodes=list(excluded),
        )
        return Run(self._attempt(number, nodes, at, excluded), nodes, at, excluded)

    def _attempt(
        self, number: int, nodes: Sequence[str], started_at: datetime, excluded: Sequence[str] = ()
    ) -> Attempt:
        return Attempt.objects.create(
            workload=self.workload,
            number=number,
            nodes=list(nodes),
            excluded_nodes=list(excluded),
            started_at=started_at,
            exit_state=AttemptExitState.RUNNING,
        )

    def end(
        self,
        run: Run,
        ended_at: datetime,
        exit_state: str,
        *,
        noticed_after: timedelta,
        exit_code: int | None = None,
        to: str = WorkloadState.FAILED,
        pending_reason: str = "",
    ) -> datetime:
        """``run`` ended at ``ended_at``; ``noticed_after`` that, the poller sees it (the
        workload ``to``: failed in the Slurm state of the same name, or requeued or held,
        pending for ``pending_reason``). Returns when the poller saw it: the story settles the
        crashes the attempt printed then (``settle``), once it has detected them."""
        self._close(run, ended_at, exit_state, exit_code)
        seen = ended_at + noticed_after
        if to == WorkloadState.FAILED:
            self.state(seen, run.number, to, exit_state.upper(), reason=_ending(exit_code))
        else:
            self.state(seen, run.number, to, "PENDING", reason=pending_reason)
        return seen

    def _close(self, run: Run, ended_at: datetime, exit_state: str, exit_code: int | None) -> None:
        attempt = run.attempt

        def write() -> None:
            attempt.ended_at = ended_at
            attempt.exit_state = exit_state
            attempt.exit_code = exit_code
            attempt.save(update_fields=["ended_at", "exit_state", "exit_code"])

        self.later(ended_at, write)

    def settle(self, at: datetime) -> None:
        """The poll at ``at`` settles the suspected crashes it can (``check_suspects``)."""
        with self.at(at):
            check_suspects(self.cluster, at)

    def keep_running(self, progress: Progress) -> Attempt:
        """The run of ``progress`` is still going, and so is the workload."""
        self.finish(WorkloadState.RUNNING, progress.run.number, progress)
        return progress.run.attempt

    def complete(
        self, progress: Progress, *, ended_after: timedelta, noticed_after: timedelta
    ) -> None:
        """The run of ``progress`` exits 0 ``ended_after`` its last step and the workload is
        done; the poller sees it ``noticed_after`` that."""
        run = progress.run
        end = progress.at + ended_after
        self._close(run, end, AttemptExitState.COMPLETED, 0)
        seen = end + noticed_after
        self.state(seen, run.number, WorkloadState.COMPLETED, "COMPLETED", reason="None")
        self.event(AuditKind.TRAINING_COMPLETED, Actor.POLLER, seen, run.number, exit_code=0)
        self.finish(WorkloadState.COMPLETED, run.number, progress, reason="COMPLETED (exit code 0)")

    def train(
        self,
        run: Run,
        pace: Pace,
        *,
        start: datetime,
        start_step: int = 0,
        until: datetime | None = None,
        to_step: int | None = None,
        checkpoint: tuple[int, datetime] | None = None,
        resumed: bool = False,
    ) -> Progress:
        """Steps of ``run`` from ``start_step`` at ``start``, at ``pace``.

        Runs until the time ``until`` or up to the step ``to_step``; the progress reader
        records the checkpoints saved on the way (and, for a restart, the first step).
        """
        attempt = run.attempt
        step_seconds, every, save_seconds = pace.step_seconds, pace.every, pace.save_seconds
        if to_step is not None:
            end_step = to_step
        elif until is not None:
            end_step = start_step + int((until - start).total_seconds() // step_seconds)
        else:
            raise ValueError("give until or to_step")
        last_at = start + timedelta(seconds=round((end_step - start_step) * step_seconds))
        checkpoint_step, checkpoint_at = checkpoint or (None, None)
        saved = False
        if resumed:
            first_at = start + timedelta(seconds=round(step_seconds))
            self.event(
                AuditKind.PROGRESS_RESUMED,
                Actor.DETECTOR,
                first_at,
                run.number,
                step=start_step + 1,
            )
        first = (start_step // every + 1) * every
        for step in range(first, end_step + 1, every):
            at = start + timedelta(seconds=round((step - start_step) * step_seconds) + save_seconds)
            if until is not None and at > until:
                break
            self.event(
                AuditKind.CHECKPOINT_SAVED,
                Actor.DETECTOR,
                at,
                run.number,
                step=step,
                path=pace.path(step),
            )
            if not saved:
                self.later(at, lambda: _mark_checkpointed(attempt))
            checkpoint_step, checkpoint_at, saved = step, at, True
        return Progress(
            run, pace, start_step, end_step, last_at, checkpoint_step, checkpoint_at, saved
        )

    def resume(
        self,
        run: Run,
        after: Progress,
        *,
        warm_up: timedelta,
        until: datetime | None = None,
        to_step: int | None = None,
    ) -> Progress:
        """``warm_up`` after ``run`` starts, the training of ``after`` goes on at its pace from
        its last checkpoint (with none, from where that earlier run began)."""
        checkpoint = (
            after.checkpoint_step or after.start_step,
            after.checkpoint_at or after.run.started_at,
        )
        return self.train(
            run,
            after.pace,
            start_step=checkpoint[0],
            start=run.started_at + warm_up,
            until=until,
            to_step=to_step,
            checkpoint=checkpoint,
            resumed=True,
        )

    # what the loop does

    def detect(
        self,
        run: Run,
        *evidence: Evidence,
        after: timedelta | None = None,
        scope: str = "",
    ) -> list[Anomaly]:
        """The loop reads ``evidence`` (one read) ``after`` its latest line, by default a few
        seconds: it records, attributes and, where it may, decides on each finding."""
        at = max(e.at for e in evidence) + (after or self.b.latency())
        with self.at(at):
            findings = [e.finding() for e in evidence]
            return record_anomalies(
                self.workload,
                run.attempt,
                findings,
                at,
                scope=scope,
                source=demo_evidence_source(findings, scope),
            )

    def recommendation(self, anomaly: Anomaly) -> Recommendation:
        """The recommendation the policy made on ``anomaly``'s attempt, as it stands now."""
        found = (
            Recommendation.objects.filter(workload=self.workload, attempt=anomaly.attempt)
            .exclude(status="superseded")
            .order_by("-created_at", "-id")
            .first()
        )
        if found is None:
            raise LookupError(f"the policy made no recommendation on {anomaly}")
        return found

    def approve(self, recommendation: Recommendation, at: datetime, by: str, note: str) -> None:
        with self.at(at):
            decisions.approve(recommendation.pk, operator=by, note=note)

    def reject(self, recommendation: Recommendation, at: datetime, by: str, note: str) -> None:
        with self.at(at):
            decisions.reject(recommendation.pk, operator=by, note=note)

    def carry_out(
        self,
        recommendation: Recommendation,
        at: datetime,
        *,
        job_state: str,
        commands: Sequence[Sequence[str]] = (),
        outcome: str = "executed",
        detail: str = "",
    ) -> datetime:
        """The controller claims ``recommendation`` at ``at``, finds the job in ``job_state``,
        runs ``commands`` a second apart and reports ``outcome``. Returns when it reported."""
        with self.at(at):
            decisions.claim(
                recommendation.pk,
                controller=self.controller,
                instance=DEMO_CONTROLLER_INSTANCE,
                lease_seconds=LEASE_SECONDS,
            )
        done = at + timedelta(seconds=len(commands) + 1)
        report = decisions.ActionReport(
            outcome=outcome,
            state_before=self.snapshot(job_state),
            commands=[{"argv": list(argv), "returncode": 0, "output": ""} for argv in commands],
            converged=True,
            detail=detail,
        )
        with self.at(done):
            decisions.report(
                recommendation.pk,
                controller=self.controller,
                instance=DEMO_CONTROLLER_INSTANCE,
                result=report,
            )
        return done

    def release_hold(self, at: datetime) -> None:
        """The watchdog's run at ``at`` releases the job held past its decision timeout."""
        with self.at(at):
            if not release_if_overdue(self.workload, _HeldJob(self), at):
                raise RuntimeError(f"the watchdog did not release job {self.job} at {at}")

    def expire(self, at: datetime) -> None:
        """The watchdog's run at ``at`` expires ready advice nobody executed in time."""
        with self.at(at):
            expire_stale_recommendations(at)

    def snapshot(self, job_state: str, *, held: bool = False) -> dict[str, Any]:
        """The job as a controller reads it from the scheduler now."""
        return job_snapshot(self.job_info(job_state, held=held))

    def job_info(self, job_state: str, *, held: bool = False) -> JobInfo:
        workload = self.workload
        attempt = workload.attempts.order_by("-number").first()
        return JobInfo(
            job_id=workload.job_id,
            name=workload.name,
            user=workload.user,
            partition=workload.partition,
            native_state=job_state,
            phase=slurm_phase(job_state),
            reason=workload.state_reason,
            comment="",
            opt_in=OptIn(opted_in=workload.opted_in, environment=workload.environment),
            nodes=[] if job_state == "PENDING" or attempt is None else list(attempt.nodes),
            excluded_nodes=list(attempt.excluded_nodes) if attempt is not None else [],
            restart_count=max(workload.current_attempt - 1, 0),
            requeue_allowed=True,
            held=held,
            submit_time=workload.submit_time,
        )


def _mark_checkpointed(attempt: Attempt) -> None:
    attempt.produced_checkpoint = True
    attempt.save(update_fields=["produced_checkpoint"])


def _ending(exit_code: int | None) -> str:
    return "NonZeroExitCode" if exit_code else "None"
