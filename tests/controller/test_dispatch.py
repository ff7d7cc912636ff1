"""Every scheduler command is written ahead: dispatched, with its exact argv, before it runs.

The dispatch is what puts a command in the trail even when its controller dies right after it,
and the last check of the lease before the command: refused or unanswered, nothing runs. The
argv dispatched must be the argv run, by the Slurm adapter and by the simulator alike.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from recovery.controller.client import AdvisorAPIError
from recovery.schedulers.base import (
    Command,
    CommandResult,
    JobInfo,
    SchedulerError,
)
from recovery.schedulers.slurm import SlurmAdapter
from recovery.simulator.adapter import SimulatedAdapter
from recovery.simulator.cluster import SimConfig, SimulatedCluster
from tests.controller.test_controller_safety import (
    STARTED,
    SUBMITTED,
    Clock,
    ExpeditingSlurm,
    FakeAPI,
    Journal,
    ModelSlurm,
    SlowSlurm,
    controller_for,
    restart,
    running_job,
)
from tests.fakes import restated

REQUEUEHOLD = ["scontrol", "requeuehold", "4242"]


class Killed(BaseException):
    """The controller's process dies (SIGKILL): nothing after it runs, nothing is reported."""


def wired(slurm: ModelSlurm, api: FakeAPI | None = None) -> FakeAPI:
    """``api`` (a new one by default) sharing its journal with ``slurm``."""
    api = api or FakeAPI()
    api.journal = slurm.journal
    return api


def assert_written_ahead(journal: Journal) -> None:
    """Every command run comes right after the dispatch of that very argv."""
    for index, (what, argv) in enumerate(journal):
        if what == "run":
            assert index > 0 and journal[index - 1] == ("dispatch", argv), journal


def runs(journal: Journal) -> list[list[str]]:
    return [list(argv) for what, argv in journal if what == "run"]


@pytest.mark.parametrize(
    ("scheduler", "recommendation", "run"),
    [
        (
            lambda: ModelSlurm(running_job()),
            restart(),
            [REQUEUEHOLD, ["scontrol", "update", "JobId=4242", "ExcNodeList=gpu-002"],
             ["scontrol", "release", "4242"]],
        ),
        (
            lambda: ModelSlurm(running_job(state="PENDING", restart_count=1, nodes=[],
                                           submit_time=SUBMITTED + timedelta(hours=1))),
            restart(excluded_nodes=["gpu-010", "gpu-002"]),
            [["scontrol", "hold", "4242"],
             ["scontrol", "update", "JobId=4242", "ExcNodeList=gpu-002,gpu-010"],
             ["scontrol", "release", "4242"]],
        ),
        (
            lambda: ModelSlurm(running_job()),
            restart(action="stop", excluded_nodes=[]),
            [["scontrol", "update", "JobId=4242", "Requeue=0"], ["scancel", "4242"]],
        ),
        (
            lambda: ExpeditingSlurm(running_job()),
            restart(action="restart", excluded_nodes=[]),
            [["scontrol", "requeue", "4242"]],
        ),
        (
            lambda: ExpeditingSlurm(running_job(), job_expedites=False),
            restart(action="restart", excluded_nodes=[]),
            [REQUEUEHOLD, ["scontrol", "release", "4242"]],
        ),
    ],
    ids=["restart-excluding", "pending-needs-exclusions", "stop", "expedited", "not-expedited"],
)  # fmt: skip
def test_every_command_is_dispatched_with_its_argv_right_before_it_runs(
    scheduler: Callable[[], ModelSlurm], recommendation: Any, run: list[list[str]]
) -> None:
    slurm = scheduler()
    api = wired(slurm, FakeAPI([recommendation]))
    assert controller_for(slurm, api).run_once() == [(1, "executed")]
    assert runs(slurm.journal) == run
    assert_written_ahead(slurm.journal)
    assert [sequence for _, _, sequence in api.dispatches] == list(
        range(1, len(api.dispatches) + 1)
    )
    assert {recommendation_id for recommendation_id, _, _ in api.dispatches} == {1}
    assert [command["argv"] for command in api.reports[0][1]["commands"]] == run


def test_an_expedited_requeue_the_job_cannot_take_leaves_its_dispatch_and_nothing_run() -> None:
    slurm = ExpeditingSlurm(running_job(), job_expedites=False)
    api = wired(slurm)
    controller_for(slurm, api).carry_out(restart(action="restart", excluded_nodes=[]))
    assert [argv for _, argv, _ in api.dispatches][:2] == [
        ["scontrol", "requeue", "4242"],
        REQUEUEHOLD,
    ]


@pytest.mark.parametrize("status", [409, 404])
def test_a_refused_dispatch_runs_nothing_and_stops_acting(status: int) -> None:
    slurm = ModelSlurm(running_job())
    api = FakeAPI([restart()], dispatch_error=AdvisorAPIError(f"POST dispatch: {status}", status))
    assert controller_for(slurm, api).run_once() == [(1, "retry")]
    assert slurm.commands == []
    body = api.reports[0][1]
    assert body["commands"] == []
    assert "stopped acting" in body["detail"] and "lease" in body["detail"]
    assert "`scontrol requeuehold 4242` not run" in body["detail"]


@pytest.mark.parametrize("status", [None, 500, 503, 429])
def test_an_unanswered_dispatch_runs_nothing_and_gives_the_recommendation_back(
    status: int | None,
) -> None:
    slurm = ModelSlurm(running_job())
    error = AdvisorAPIError("POST dispatch: control plane unreachable", status)
    api = FakeAPI([restart()], dispatch_error=error)
    assert controller_for(slurm, api).run_once() == [(1, "retry")]
    assert slurm.commands == []
    assert "`scontrol requeuehold 4242` not run" in api.reports[0][1]["detail"]


def test_a_lease_lost_half_way_stops_before_the_next_command() -> None:
    class TakenOver(FakeAPI):
        def dispatch(self, recommendation_id: int, argv: Sequence[str], sequence: int) -> None:
            if sequence == 2:
                raise AdvisorAPIError("POST dispatch: 409 held by controller:other", 409)
            super().dispatch(recommendation_id, argv, sequence)

    slurm = ModelSlurm(running_job())
    api = wired(slurm, TakenOver([restart()]))
    assert controller_for(slurm, api).run_once() == [(1, "retry")]
    assert slurm.commands == ["requeuehold"]
    assert [c["argv"] for c in api.reports[0][1]["commands"]] == [REQUEUEHOLD]


def test_a_lease_that_ran_out_during_a_slow_command_is_caught_by_the_next_dispatch() -> None:
    """
    GIVEN a controller whose requeuehold takes longer than is left of its lease
    WHEN the control plane refuses its next dispatch (the lease ran out)
    THEN nothing more runs, though no renewal was due yet
    """
    clock = Clock()
    slurm = SlowSlurm(running_job(state="PENDING", restart_count=1, nodes=[], held=True,
                                  submit_time=SUBMITTED + timedelta(hours=1)), clock)  # fmt: skip
    api = wired(slurm, FakeAPI([restart()]))
    slurm.after["update"] = lambda: setattr(api, "lease_lost", True)
    # A lease of 600 s: no renewal due between the two commands.
    assert controller_for(slurm, api, clock, lease_seconds=600).run_once() == [(1, "retry")]
    assert api.renewals == []
    assert slurm.commands == ["update"]  # the release was never run
    assert_written_ahead(slurm.journal)


def test_a_controller_killed_after_requeuehold_leaves_it_in_the_trail() -> None:
    """
    GIVEN a controller SIGKILLed right after its requeuehold took effect
    WHEN its successor takes the recommendation up
    THEN the requeuehold was dispatched before it ran, the successor does not repeat it, and
         every command the scheduler saw was dispatched first
    """
    slurm = ModelSlurm(running_job())
    api = wired(slurm, FakeAPI([restart()]))

    def die() -> None:
        raise Killed

    slurm.after["requeuehold"] = die
    with pytest.raises(Killed):
        controller_for(slurm, api).run_once()
    assert api.dispatches == [(1, REQUEUEHOLD, 1)]
    assert api.reports == []  # it never got to report
    assert slurm.job is not None and slurm.job.restart_count == 1
    assert controller_for(slurm, api).run_once() == [(1, "executed")]
    assert slurm.commands == ["requeuehold", "update", "release"]
    assert_written_ahead(slurm.journal)
    assert [sequence for _, _, sequence in api.dispatches] == [1, 1, 2]  # per handling


def test_a_command_whose_effect_is_unknown_is_dispatched_and_named_in_the_report() -> None:
    slurm = ModelSlurm(running_job())
    slurm.drop_after = "requeuehold"  # it took effect, then the connection dropped
    api = wired(slurm, FakeAPI([restart()]))
    assert controller_for(slurm, api).run_once() == [(1, "retry")]
    body = api.reports[0][1]
    assert "the effect of `scontrol requeuehold 4242` is unknown" in body["detail"]
    assert body["converged"] is False
    assert api.dispatches == [(1, REQUEUEHOLD, 1)]


def restarted_by_someone_else(job: JobInfo) -> JobInfo:
    later = STARTED + timedelta(minutes=10)
    return restated(job, "RUNNING", restart_count=1, submit_time=later, start_time=later)


def started_again_uncounted(job: JobInfo) -> JobInfo:
    return restated(job, "RUNNING", start_time=STARTED + timedelta(minutes=10))


@pytest.mark.parametrize(
    ("meanwhile", "outcome", "said"),
    [
        (restarted_by_someone_else, "retry", "changed since it was read"),
        (started_again_uncounted, "skipped", "nothing restarted"),
    ],
    ids=["restart-count-moved", "started-again"],
)
def test_a_controller_resumed_after_a_pause_does_not_requeue_an_attempt_restarted_meanwhile(
    meanwhile: Any, outcome: str, said: str
) -> None:
    """
    GIVEN a controller that read the failed job, then stood still (SIGSTOP) while the job was
          restarted by someone else
    WHEN it resumes, and its dispatch of the requeue goes through
    THEN it reads the job once more before requeueing, and does not requeue it
    """
    slurm = ModelSlurm(running_job(state="FAILED"))

    class Paused(FakeAPI):
        def dispatch(self, recommendation_id: int, argv: Sequence[str], sequence: int) -> None:
            super().dispatch(recommendation_id, argv, sequence)
            if list(argv) == REQUEUEHOLD:
                assert slurm.job is not None
                slurm.job = meanwhile(slurm.job)

    api = Paused([restart()])
    assert controller_for(slurm, api).run_once() == [(1, outcome)]
    assert slurm.commands == []
    assert said in api.reports[0][1]["detail"]
    assert api.reports[0][1]["commands"] == []


def test_the_expedited_requeue_is_checked_again_after_its_dispatch_too() -> None:
    slurm = ExpeditingSlurm(running_job(state="FAILED"))

    class Paused(FakeAPI):
        def dispatch(self, recommendation_id: int, argv: Sequence[str], sequence: int) -> None:
            super().dispatch(recommendation_id, argv, sequence)
            assert slurm.job is not None
            slurm.job = restarted_by_someone_else(slurm.job)

    api = Paused([restart(action="restart", excluded_nodes=[])])
    assert controller_for(slurm, api).run_once() == [(1, "retry")]
    assert slurm.commands == []
    assert [argv for _, argv, _ in api.dispatches] == [["scontrol", "requeue", "4242"]]


# ---------------------------------------------------------------------- what the adapters run


class RecordingTransport:
    name = "recording"

    def __init__(self) -> None:
        self.argvs: list[tuple[str, ...]] = []

    def run(self, argv: Sequence[str], *, timeout: float = 30.0) -> CommandResult:
        self.argvs.append(tuple(argv))
        return CommandResult(tuple(argv), 0, "", "")


NODES = ["gpu-010", "gpu-002", "gpu-9", "gpu-002", "gpu-001"]


def test_the_slurm_adapter_runs_exactly_the_argv_it_plans() -> None:
    transport = RecordingTransport()
    adapter = SlurmAdapter(transport)  # type: ignore[arg-type]
    adapter.requeue("77")
    adapter.requeue("77", hold=True)
    adapter.set_excluded_nodes("77", NODES)
    adapter.set_excluded_nodes("77", [])
    adapter.clear_start_delay("77")
    adapter.release("77")
    adapter.hold("77")
    adapter.cancel("77")
    adapter.disable_requeue("77")
    assert transport.argvs == [
        adapter.planned_argv(Command.REQUEUE, "77"),
        adapter.planned_argv(Command.REQUEUE_HOLD, "77"),
        adapter.planned_argv(Command.SET_EXCLUDED_NODES, "77", NODES),
        adapter.planned_argv(Command.SET_EXCLUDED_NODES, "77", []),
        adapter.planned_argv(Command.CLEAR_START_DELAY, "77"),
        adapter.planned_argv(Command.RELEASE, "77"),
        adapter.planned_argv(Command.HOLD, "77"),
        adapter.planned_argv(Command.CANCEL, "77"),
        adapter.planned_argv(Command.DISABLE_REQUEUE, "77"),
    ]
    # Slurm's compressed hostlist, as before the argv was planned.
    assert transport.argvs[2] == (
        "scontrol", "update", "JobId=77", "ExcNodeList=gpu-[001-002,9,010]"
    )  # fmt: skip
    assert transport.argvs[3][-1] == "ExcNodeList="


def test_the_slurm_adapters_expedited_requeue_runs_the_argv_it_plans() -> None:
    class Expediting(SlurmAdapter):
        def supports_expedited_requeue(self) -> bool:
            return True

        def get_job(self, job_id: str) -> JobInfo | None:
            return running_job(job_id=job_id, job_flags=("EXPEDITED_REQUEUE",))

    transport = RecordingTransport()
    adapter = Expediting(transport)  # type: ignore[arg-type]
    adapter.requeue_expedited("77")
    assert transport.argvs == [adapter.planned_argv(Command.REQUEUE_EXPEDITED, "77")]


# Each simulated command: what it is planned as, the cluster's method, its arguments after the
# job id.
SIMULATED: list[tuple[Command, str, tuple[Any, ...], dict[str, Any]]] = [
    (Command.REQUEUE, "requeue", (), {}),
    (Command.REQUEUE_HOLD, "requeue", (), {"hold": True}),
    (Command.SET_EXCLUDED_NODES, "set_excluded_nodes", (NODES,), {}),
    (Command.SET_EXCLUDED_NODES, "set_excluded_nodes", ([],), {}),
    (Command.CLEAR_START_DELAY, "clear_start_delay", (), {}),
    (Command.RELEASE, "release", (), {}),
    (Command.HOLD, "hold", (), {}),
    (Command.DISABLE_REQUEUE, "disable_requeue", (), {}),
    (Command.CANCEL, "cancel", (), {}),
]


@pytest.mark.parametrize("known", [True, False], ids=["its-job", "an-unknown-job"])
def test_the_simulator_runs_exactly_the_argv_its_adapter_plans(tmp_path: Path, known: bool) -> None:
    """The simulated adapter inherits ``planned_argv``; its cluster builds the argv itself.
    A command the simulated scheduler refuses carries the argv it received, too."""
    cluster = SimulatedCluster(
        SimConfig(name="lab", nodes=4, jobs=1, seed=7, log_dir=str(tmp_path),
                  faults_per_job_hour=0.0, bad_node_fraction=0.0),
        now=datetime(2026, 11, 29, 18, 0, tzinfo=UTC),
    )  # fmt: skip
    planner = SimulatedAdapter(None)  # type: ignore[arg-type]  # planning reads no state
    job_id = cluster.jobs()[0].job_id if known else "999999"
    for command, method, args, options in SIMULATED:
        try:
            result: CommandResult = getattr(cluster, method)(job_id, *args, **options)
        except SchedulerError as exc:
            assert exc.result is not None
            result = exc.result
        nodes = args[0] if args else ()
        assert result.argv == planner.planned_argv(command, job_id, nodes), command
    assert planner.planned_argv(Command.SET_EXCLUDED_NODES, "1", NODES)[-1] == (
        "ExcNodeList=gpu-001,gpu-002,gpu-9,gpu-010"
    )
