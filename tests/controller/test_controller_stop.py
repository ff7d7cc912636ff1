"""A stop claimed while the failed attempt is still ending is carried out, not failed.

The scheduler is scripted here; tests/slurm and tests/e2e stop real Slurm jobs.
"""

from __future__ import annotations

from recovery.controller.client import ReadyRecommendation
from recovery.controller.controller import AdvisorController
from recovery.schedulers.base import CommandResult, SchedulerError
from tests.fakes import SUBMITTED, Scripted, job, restated


class Ending(Scripted):
    """A job COMPLETING for two reads, then FAILED; Requeue=0 refused once it finished."""

    def __init__(self) -> None:
        super().__init__([job(state="COMPLETING")])
        self.reads = 0
        self.commands: list[str] = []

    def get_job(self, job_id: str):  # type: ignore[no-untyped-def]
        self.reads += 1
        if self.reads > 2:
            self.jobs = [restated(self.jobs[0], "FAILED", exit_code=1)]
        return super().get_job(job_id)

    def disable_requeue(self, job_id: str) -> CommandResult:  # type: ignore[override]
        self.commands.append("disable_requeue")
        raise SchedulerError("Job has already finished")

    def cancel(self, job_id: str) -> CommandResult:  # type: ignore[override]
        self.commands.append("cancel")
        return CommandResult(("scancel", job_id), 0, "", "")


def stop_recommendation() -> ReadyRecommendation:
    return ReadyRecommendation(
        id=8,
        job_id="4242",
        partition="gpu",
        attempt=3,
        action="stop",
        excluded_nodes=[],
        reason="2 attempts in a row saved no checkpoint",
        submit_time=SUBMITTED,
        user="alice",
    )


def test_a_stop_waits_for_the_ending_attempt_and_finds_nothing_left_to_stop() -> None:
    scheduler = Ending()
    controller = AdvisorController(None, scheduler, poll_seconds=0, sleep=lambda _: None)  # type: ignore[arg-type]
    outcome = controller.carry_out(stop_recommendation())
    assert outcome.outcome == "skipped", outcome.detail
    assert outcome.converged is True
    assert scheduler.commands == []
