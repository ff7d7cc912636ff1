"""The controller's engine is the same for every scheduler: a scheduler brings its executor.

The engine claims, keeps the lease, checks that the job is the recommendation's and that its
owner left the action to the loop, writes every command ahead, and reports. Here it runs an
executor of a scheduler that is not Slurm, and refuses what an adapter cannot do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from recovery.controller.client import ReadyRecommendation
from recovery.controller.controller import AdvisorController, Executor
from recovery.controller.outcome import Outcome
from recovery.controller.steps import Steps
from recovery.schedulers.base import (
    Command,
    CommandResult,
    JobInfo,
    NodeInfo,
    SchedulerAdapter,
)
from recovery.schedulers.capabilities import Capabilities
from recovery.schedulers.phase import Phase
from tests.controller.test_controller_safety import (
    Clock,
    FakeAPI,
    ModelSlurm,
    restart,
    running_job,
)


class Queue(SchedulerAdapter):
    """A scheduler that is not Slurm: it restarts a job by resubmitting it as it was, and
    knows nothing of excluding nodes, holds or drains."""

    capabilities = Capabilities(requeue=True)

    def __init__(self, job: JobInfo) -> None:
        self.job = job
        self.ran: list[tuple[str, ...]] = []

    def list_jobs(self) -> list[JobInfo]:
        return [self.job]

    def get_job(self, job_id: str) -> JobInfo | None:
        return self.job if job_id == self.job.job_id else None

    def list_nodes(self) -> list[NodeInfo]:
        return []

    def planned_argv(
        self, command: Command, job_id: str, nodes: Sequence[str] = ()
    ) -> tuple[str, ...]:
        return ("queue", str(command), job_id)

    def requeue(self, job_id: str, *, hold: bool = False) -> CommandResult:
        argv = self.planned_argv(Command.REQUEUE, job_id)
        self.ran.append(argv)
        return CommandResult(argv, 0, "", "")

    def _unused(self, *args: object, **kwargs: object) -> CommandResult:
        raise AssertionError("the executor runs no other command")

    set_excluded_nodes = clear_start_delay = release = hold = cancel = disable_requeue = _unused


@dataclass
class Resubmitting:
    """The executor of ``Queue``: a restart is one resubmission, decided on the job's phase."""

    seen: list[Phase | None] = field(default_factory=list)

    def restart(
        self, steps: Steps, recommendation: ReadyRecommendation, job: JobInfo, outcome: Outcome
    ) -> None:
        self.seen.append(job.phase)
        steps.command(
            outcome, Command.REQUEUE, job.job_id, lambda: steps.adapter.requeue(job.job_id)
        )
        outcome.converged = True

    def stop(
        self, steps: Steps, recommendation: ReadyRecommendation, job: JobInfo, outcome: Outcome
    ) -> None:
        raise AssertionError("no stop asked for")


def engine_for(adapter: SchedulerAdapter, api: FakeAPI, executor: Executor) -> AdvisorController:
    clock = Clock()
    return AdvisorController(
        api,
        adapter,
        executor=executor,
        poll_seconds=0.5,
        settle_seconds=5,
        sleep=clock.sleep,
        clock=clock,
    )


def test_the_engine_carries_out_another_schedulers_restart_written_ahead() -> None:
    job = running_job(state="Failed", phase=Phase.FAILED)
    queue, api, executor = Queue(job), FakeAPI(), Resubmitting()
    api.recommendations = [restart(action="restart", excluded_nodes=[])]
    engine = engine_for(queue, api, executor)

    assert engine.run_once() == [(1, "executed")]

    assert executor.seen == [Phase.FAILED]
    assert queue.ran == [("queue", "requeue", "4242")]
    assert api.dispatches == [(1, ["queue", "requeue", "4242"], 1)]
    (reported,) = api.reports
    assert reported[1]["outcome"] == "executed" and reported[1]["converged"] is True
    assert reported[1]["state_before"]["job_state"] == "Failed"


def test_the_engine_checks_the_job_is_the_recommendations_whatever_the_executor() -> None:
    queue, executor = Queue(running_job(state="Failed", user="mallory")), Resubmitting()
    outcome = engine_for(queue, FakeAPI(), executor).carry_out(
        restart(action="restart", excluded_nodes=[])
    )
    assert outcome.outcome == "failed" and "belongs to 'mallory'" in outcome.detail
    assert executor.seen == [] and queue.ran == []


def test_what_an_adapter_cannot_do_is_refused_before_any_command() -> None:
    queue, api, executor = Queue(running_job(state="Failed")), FakeAPI(), Resubmitting()
    engine = engine_for(queue, api, executor)

    excluding = engine.carry_out(restart(action="restart_excluding", excluded_nodes=["gpu-002"]))
    drain = engine.carry_out(restart(action="drain", node="gpu-002", excluded_nodes=[]))

    assert excluding.outcome == "failed"
    assert excluding.detail == (
        "refused before any command: this scheduler's adapter cannot keep nodes out of a "
        "restarted job"
    )
    assert drain.outcome == "failed" and "cannot drain or resume a node" in drain.detail
    assert queue.ran == [] and api.dispatches == [] and executor.seen == []


def test_slurm_can_do_every_action_the_policy_recommends() -> None:
    slurm = ModelSlurm(running_job())
    for action in ("restart", "restart_excluding", "stop", "drain", "resume"):
        assert slurm.capabilities.missing_for(action, excluding=True) == ""


def test_an_adapter_says_what_it_can_do_or_can_do_nothing() -> None:
    nothing = SchedulerAdapter.capabilities
    assert nothing.missing_for("restart") == "restart a job in place"
    assert nothing.missing_for("resume") == "drain or resume a node"
    assert nothing.missing_for("stop") == ""
