"""The Slurm Advisor Controller: carries out claimed recommendations, exactly once.

Every step is decided from the scheduler's state read *now*, never from memory of what this
or another controller meant to do: a controller killed half-way and restarted (or a second
controller taking over an expired lease) reads the job, sees what already happened, and does
only what is left. A restart of attempt N is done when Slurm's restart count has reached N,
the excluded nodes are set and the job is no longer held; a stop is done when further requeue
is disabled and the job has ended.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from recovery.advisor_client import AdvisorAPIError, ReadyRecommendation
from recovery.schedulers.base import CommandResult, JobInfo, SchedulerAdapter, SchedulerError

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
RESTART = {"restart", "restart_excluding"}
STOP = "stop"


class AdvisorAPI(Protocol):
    def ready(self) -> list[ReadyRecommendation]: ...

    def claim(self, recommendation_id: int, lease_seconds: int) -> ReadyRecommendation: ...

    def report(self, recommendation_id: int, body: dict[str, Any]) -> None: ...


@dataclass
class Outcome:
    outcome: str  # executed, skipped or failed
    state_before: dict[str, Any]
    commands: list[dict[str, Any]] = field(default_factory=list)
    converged: bool | None = None
    detail: str = ""

    def body(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "state_before": self.state_before,
            "commands": self.commands,
            "converged": self.converged,
            "detail": self.detail,
        }


def job_snapshot(job: JobInfo | None) -> dict[str, Any]:
    if job is None:
        return {"known": False}
    return {
        "known": True,
        "job_state": job.state,
        "reason": job.reason,
        "restart_count": job.restart_count,
        "nodes": job.nodes,
        "excluded_nodes": job.excluded_nodes,
        "held": job.held,
        "requeue_allowed": job.requeue_allowed,
    }


class AdvisorController:
    def __init__(
        self,
        api: AdvisorAPI,
        adapter: SchedulerAdapter,
        *,
        partitions: Sequence[str] = (),
        lease_seconds: int = 120,
        settle_seconds: float = 30.0,
        poll_seconds: float = 0.5,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.api = api
        self.adapter = adapter
        self.partitions = set(partitions)
        self.lease_seconds = lease_seconds
        self.settle_seconds = settle_seconds
        self.poll_seconds = poll_seconds
        self.sleep = sleep

    def run_once(self) -> list[tuple[int, str]]:
        """Claim and carry out everything ready; return (recommendation id, outcome) pairs."""
        done = []
        for recommendation in self.api.ready():
            if self.partitions and recommendation.partition not in self.partitions:
                logger.info(
                    "recommendation %s left alone: partition %r is not in the allowlist",
                    recommendation.id,
                    recommendation.partition,
                )
                continue
            try:
                claimed = self.api.claim(recommendation.id, self.lease_seconds)
            except AdvisorAPIError as exc:
                if exc.status == 409:
                    continue  # another controller got it first
                raise
            outcome = self.carry_out(claimed)
            self.api.report(claimed.id, outcome.body())
            done.append((claimed.id, outcome.outcome))
        return done

    # ------------------------------------------------------------------ one recommendation

    def carry_out(self, recommendation: ReadyRecommendation) -> Outcome:
        try:
            job = self.adapter.get_job(recommendation.job_id)
        except (SchedulerError, ValueError) as exc:
            return Outcome("failed", {"known": None}, detail=f"cannot read the job: {exc}")
        outcome = Outcome("skipped", job_snapshot(job))
        if job is None:
            outcome.outcome = "failed"
            outcome.detail = "the scheduler no longer knows the job"
            return outcome
        try:
            if recommendation.action in RESTART:
                self._restart(recommendation, job, outcome)
            elif recommendation.action == STOP:
                self._stop(recommendation, job, outcome)
            else:
                outcome.detail = f"nothing to do for action {recommendation.action!r}"
                outcome.converged = True
        except SchedulerError as exc:
            outcome.outcome = "failed"
            outcome.detail = str(exc)
            if exc.result is not None:
                self._record(outcome, exc.result)
        return outcome

    def _restart(self, recommendation: ReadyRecommendation, job: JobInfo, outcome: Outcome) -> None:
        if recommendation.attempt is None:
            raise SchedulerError("the recommendation names no attempt: cannot tell if it is done")
        if job.state in FINISHED_STATES and not job.requeue_allowed:
            outcome.outcome = "failed"
            outcome.converged = False
            outcome.detail = f"abandoned: the job ended {job.state} and Slurm will not requeue it"
            return
        wanted_exclusions = sorted(set(job.excluded_nodes) | set(recommendation.excluded_nodes))
        missing_exclusions = not set(recommendation.excluded_nodes) <= set(job.excluded_nodes)
        waiting = job.state in {"PENDING", "COMPLETING", "CONFIGURING"}
        if job.restart_count < recommendation.attempt and not waiting:
            self._act(outcome, self.adapter.requeue(job.job_id, hold=True))
            job = self._wait(job.job_id, lambda j: j.state in {"PENDING", "COMPLETING"})
        elif missing_exclusions and job.is_pending and not job.held:
            # Keep it from starting on an excluded node while the exclusion is set.
            self._act(outcome, self.adapter.hold(job.job_id))
        if missing_exclusions:
            self._act(outcome, self._exclude(job.job_id, wanted_exclusions))
        current = self.adapter.get_job(job.job_id)
        if current is not None and current.held:
            self._act(outcome, self.adapter.release(job.job_id))
        final = self.adapter.get_job(job.job_id)
        outcome.converged = bool(
            final is not None
            and final.restart_count >= recommendation.attempt
            and set(recommendation.excluded_nodes) <= set(final.excluded_nodes)
            and not final.held
            and final.state not in FINISHED_STATES
        )
        if not outcome.converged:
            reason = (
                "abandoned" if final is None or final.state in FINISHED_STATES else "not converged"
            )
            outcome.detail = outcome.detail or f"{reason}: {job_snapshot(final)}"

    def _exclude(self, job_id: str, nodes: list[str]) -> CommandResult:
        """Set the exclusions; Slurm accepts them only once the requeued job is pending."""
        deadline = time.monotonic() + self.settle_seconds
        while True:
            try:
                return self.adapter.set_excluded_nodes(job_id, nodes)
            except SchedulerError as exc:
                if "no longer pending" not in str(exc) or time.monotonic() > deadline:
                    raise
            self.sleep(self.poll_seconds)

    def _stop(self, recommendation: ReadyRecommendation, job: JobInfo, outcome: Outcome) -> None:
        if job.state == "COMPLETING":
            # The failed attempt is still winding down; Slurm refuses updates until it ends.
            job = self._wait(job.job_id, lambda j: j.state != "COMPLETING")
        if job.requeue_allowed and job.state not in FINISHED_STATES:
            try:
                self._act(outcome, self.adapter.disable_requeue(job.job_id))
            except SchedulerError:
                current = self.adapter.get_job(job.job_id)
                if current is None or current.state not in FINISHED_STATES:
                    raise
                job = current  # it ended meanwhile: nothing left that could restart it
        if job.state not in FINISHED_STATES:
            self._act(outcome, self.adapter.cancel(job.job_id))
            job = self._wait(job.job_id, lambda j: j.state in FINISHED_STATES)
        outcome.converged = job.state in FINISHED_STATES

    def _wait(self, job_id: str, reached: Callable[[JobInfo], bool]) -> JobInfo:
        deadline = time.monotonic() + self.settle_seconds
        while True:
            job = self.adapter.get_job(job_id)
            if job is None:
                raise SchedulerError(f"job {job_id} disappeared while being acted on")
            if reached(job) or time.monotonic() > deadline:
                return job
            self.sleep(self.poll_seconds)

    def _act(self, outcome: Outcome, result: CommandResult) -> None:
        outcome.outcome = "executed"
        self._record(outcome, result)

    @staticmethod
    def _record(outcome: Outcome, result: CommandResult) -> None:
        outcome.commands.append(
            {
                "argv": list(result.argv),
                "returncode": result.returncode,
                "output": (result.stdout + result.stderr)[-2000:],
            }
        )
