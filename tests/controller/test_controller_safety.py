"""The Advisor Controller never acts on a guess, finishes what it started, and serves the rest.

The scheduler here is an in-memory model of the Slurm behaviour the controller relies on
(requeue raises the restart count and resets the submit time, exclusions only while pending,
holds and releases), with faults injected where real Slurm and SSH fail. The same paths run on
real Slurm 22.05 and 24.11 in tests/slurm.
"""

from __future__ import annotations

import argparse
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

import pytest

from recovery.controller.client import AdvisorAPIError, ControllerIdentity, ReadyRecommendation
from recovery.controller.controller import AdvisorController, MisconfiguredController
from recovery.schedulers.base import (
    CommandResult,
    ExpeditedRequeueUnavailable,
    JobInfo,
    NodeInfo,
    SchedulerAdapter,
    SchedulerError,
)
from recovery.schedulers.compat import UTC
from recovery.schedulers.slurm import SLURM_CAPABILITIES
from tests.fakes import job, restated

SUBMITTED = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
STARTED = SUBMITTED + timedelta(seconds=5)


def running_job(**fields: Any) -> JobInfo:
    values: dict[str, Any] = {
        "nodes": ["gpu-001", "gpu-002"],
        "submit_time": SUBMITTED,
        "start_time": STARTED,
    }
    return job(**{**values, **fields})


def restart(**fields: Any) -> ReadyRecommendation:
    values: dict[str, Any] = {
        "id": 1,
        "job_id": "4242",
        "partition": "gpu",
        "attempt": 1,
        "action": "restart_excluding",
        "excluded_nodes": ["gpu-002"],
        "reason": "Xid 79 on gpu-002",
        "submit_time": SUBMITTED,
        "user": "alice",
        "attempt_started_at": STARTED,
    }
    values.update(fields)
    return ReadyRecommendation(**values)


def refused(argv: Sequence[str], said: str) -> SchedulerError:
    result = CommandResult(tuple(argv), 1, "", said)
    return SchedulerError(result.describe(), result)


# What the controller posted and the scheduler ran, in order: ("dispatch" or "run", argv).
Journal = list[tuple[str, tuple[str, ...]]]


class ModelSlurm(SchedulerAdapter):
    """One job, changed by the controller's commands the way Slurm changes it."""

    capabilities = SLURM_CAPABILITIES

    def __init__(self, job: JobInfo, *, cluster: str | None = "lab") -> None:
        self.job: JobInfo | None = job
        self.commands: list[str] = []
        self.journal: Journal = []  # every command run, with its argv
        self.read_errors = 0  # reads that fail as an unreachable scheduler does
        self.drop_after: str = ""  # a command that takes effect, then the connection drops
        # Called once a command (by its verb) has taken effect, before it returns.
        self.after: dict[str, Callable[[], None]] = {}
        self.cluster = cluster

    def cluster_name(self) -> str | None:
        return self.cluster

    def get_job(self, job_id: str) -> JobInfo | None:
        if self.read_errors:
            self.read_errors -= 1
            raise SchedulerError("ssh to login01 failed: Connection reset by peer")
        return self.job

    def list_jobs(self) -> list[JobInfo]:
        return [self.job] if self.job else []

    def list_nodes(self) -> list[NodeInfo]:
        return []

    def _done(self, *argv: str) -> CommandResult:
        verb = argv[1] if argv[0] == "scontrol" else argv[0]
        self.commands.append(verb)
        self.journal.append(("run", argv))
        if verb in self.after:
            self.after.pop(verb)()
        if self.drop_after == verb:
            self.drop_after = ""
            raise SchedulerError(f"the SSH connection dropped while `{verb}` ran")
        return CommandResult(argv, 0, "", "")

    def _job(self) -> JobInfo:
        assert self.job is not None
        return self.job

    def requeue(self, job_id: str, *, hold: bool = False) -> CommandResult:
        job = self._job()
        verb = "requeuehold" if hold else "requeue"
        if job.native_state in {"PENDING", "COMPLETING"}:
            raise refused(["scontrol", verb, job_id], f"Job is pending execution for job {job_id}")
        self.job = restated(
            job,
            "PENDING",
            held=hold,
            restart_count=(job.restart_count or 0) + 1,
            submit_time=(job.submit_time or SUBMITTED) + timedelta(hours=1),
            nodes=[],
        )
        return self._done("scontrol", verb, job_id)

    def set_excluded_nodes(self, job_id: str, nodes: Sequence[str]) -> CommandResult:
        job = self._job()
        if job.native_state not in {"PENDING", "COMPLETING"}:
            argv = ["scontrol", "update", f"JobId={job_id}"]
            raise refused(argv, f"Job is no longer pending execution for job {job_id}")
        self.job = replace(job, excluded_nodes=list(nodes))
        return self._done("scontrol", "update", f"JobId={job_id}", f"ExcNodeList={','.join(nodes)}")

    def release(self, job_id: str) -> CommandResult:
        self.job = replace(self._job(), held=False)
        return self._done("scontrol", "release", job_id)

    def hold(self, job_id: str) -> CommandResult:
        self.job = replace(self._job(), held=True)
        return self._done("scontrol", "hold", job_id)

    def cancel(self, job_id: str) -> CommandResult:
        self.job = restated(self._job(), "CANCELLED")
        return self._done("scancel", job_id)

    def disable_requeue(self, job_id: str) -> CommandResult:
        self.job = replace(self._job(), requeue_allowed=False)
        return self._done("scontrol", "update", f"JobId={job_id}", "Requeue=0")

    def clear_start_delay(self, job_id: str) -> CommandResult:
        return self._done("scontrol", "update", f"JobId={job_id}", "StartTime=now")


@dataclass
class FakeAPI:
    recommendations: list[ReadyRecommendation] = field(default_factory=list)
    reports: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    renewals: list[int] = field(default_factory=list)
    # (recommendation, argv, sequence) per dispatch recorded.
    dispatches: list[tuple[int, list[str], int]] = field(default_factory=list)
    journal: Journal = field(default_factory=list)  # shared with a ModelSlurm to see the order
    lease_lost: bool = False  # renewals and dispatches are refused (409)
    dispatch_error: AdvisorAPIError | None = None  # what every dispatch raises
    cluster: str = "lab"
    scheduler_cluster_name: str = "lab"

    def ready(self) -> list[ReadyRecommendation]:
        return list(self.recommendations)

    def claim(self, recommendation_id: int, lease_seconds: int) -> ReadyRecommendation:
        return next(r for r in self.recommendations if r.id == recommendation_id)

    def renew(self, recommendation_id: int, lease_seconds: int) -> None:
        if self.lease_lost:
            raise AdvisorAPIError("409 held by controller:other", 409)
        self.renewals.append(recommendation_id)

    def dispatch(self, recommendation_id: int, argv: Sequence[str], sequence: int) -> None:
        if self.lease_lost:
            raise AdvisorAPIError("409 held by controller:other", 409)
        if self.dispatch_error is not None:
            raise self.dispatch_error
        self.dispatches.append((recommendation_id, list(argv), sequence))
        self.journal.append(("dispatch", tuple(argv)))

    def report(self, recommendation_id: int, body: dict[str, Any]) -> None:
        self.reports.append((recommendation_id, body))

    def identity(self) -> ControllerIdentity:
        return ControllerIdentity(self.cluster, self.scheduler_cluster_name, "controller:test")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def controller_for(
    slurm: ModelSlurm, api: FakeAPI | None = None, clock: Clock | None = None, **options: Any
) -> AdvisorController:
    clock = clock or Clock()
    return AdvisorController(
        api or FakeAPI(),
        slurm,
        poll_seconds=0.5,
        settle_seconds=5,
        sleep=clock.sleep,
        clock=clock,
        **options,
    )


# ---------------------------------------------------------------------- unknown facts


@pytest.mark.parametrize(
    ("unknown", "why"),
    [
        ("restart_count", "the fixed-format squeue output has no restart count"),
        ("excluded_nodes", "excluded_nodes: unknown shape dict"),
        ("requeue_allowed", "requeue: absent"),
        ("held", "priority: not set"),
        ("phase", "job_state: unknown shape"),
        ("submit_time", "submit_time: infinite"),
    ],
)
def test_nothing_is_done_while_a_fact_the_restart_needs_is_unknown(unknown: str, why: str) -> None:
    slurm = ModelSlurm(running_job(**{unknown: None, "unreadable": {unknown: why}}))
    outcome = controller_for(slurm).carry_out(restart())
    assert slurm.commands == []
    assert outcome.outcome == "retry"
    assert why in outcome.detail and unknown in outcome.detail


def test_a_job_already_restarted_is_not_restarted_again_and_keeps_its_own_exclusions() -> None:
    # What the fixed-format reader used to report as restart count 0 and no exclusions.
    slurm = ModelSlurm(
        running_job(restart_count=1, excluded_nodes=["gpu-009", "gpu-002"], nodes=["gpu-003"],
                    submit_time=SUBMITTED + timedelta(hours=1))
    )  # fmt: skip
    outcome = controller_for(slurm).carry_out(restart())
    assert slurm.commands == []
    assert (outcome.outcome, outcome.converged) == ("skipped", True)


def test_the_jobs_own_exclusions_are_kept_beside_the_recommendations() -> None:
    slurm = ModelSlurm(running_job(excluded_nodes=["gpu-009"]))
    outcome = controller_for(slurm).carry_out(restart())
    assert outcome.outcome == "executed" and outcome.converged
    assert slurm.job is not None and slurm.job.excluded_nodes == ["gpu-002", "gpu-009"]


# ---------------------------------------------------------------------- identity


@pytest.mark.parametrize(
    "job",
    [
        running_job(user="mallory"),
        running_job(submit_time=SUBMITTED + timedelta(days=3)),  # id handed out again
        running_job(submit_time=SUBMITTED - timedelta(days=3)),
    ],
    ids=["another-user", "later-submit-no-restart", "earlier-submit"],
)
def test_a_job_id_that_names_another_job_is_never_acted_on(job: JobInfo) -> None:
    slurm = ModelSlurm(job)
    outcome = controller_for(slurm).carry_out(restart())
    assert slurm.commands == []
    assert outcome.outcome == "failed"
    assert "refused before any command" in outcome.detail


OBSERVED = '{"nvidia-recovery":{"environment":"prod","mode":"observe"}}'


@pytest.mark.parametrize(
    "comment",
    [OBSERVED, '{"nvidia-recovery":{"environment":"prod"}}', ""],
    ids=["observe", "no-mode-is-observe", "no-longer-opted-in"],
)
def test_a_job_its_owner_left_to_observation_is_not_acted_on_without_approval(
    comment: str,
) -> None:
    """
    GIVEN a ready recommendation the policy made itself
    WHEN the job's comment, read at the time of acting, does not ask for "act"
    THEN nothing is run, and the controller says why
    """
    slurm = ModelSlurm(running_job(comment=comment))
    outcome = controller_for(slurm).carry_out(restart())
    assert slurm.commands == []
    assert outcome.outcome == "failed"
    assert "refused before any command" in outcome.detail and "nobody approved" in outcome.detail


def test_an_observed_job_is_acted_on_once_an_operator_approved() -> None:
    slurm = ModelSlurm(running_job(comment=OBSERVED))
    outcome = controller_for(slurm).carry_out(restart(approved_by="olivia"))
    assert outcome.outcome == "executed" and outcome.converged
    assert "requeuehold" in slurm.commands


def test_a_requeue_moves_the_submit_time_and_it_is_still_the_same_job() -> None:
    slurm = ModelSlurm(running_job())
    first = controller_for(slurm).carry_out(restart(attempt=1))
    assert first.converged
    restarted_at = STARTED + timedelta(hours=2)
    assert slurm.job is not None
    slurm.job = restated(slurm.job, "RUNNING", nodes=["gpu-003"], start_time=restarted_at)
    second = controller_for(slurm).carry_out(
        restart(id=2, attempt=2, excluded_nodes=[], attempt_started_at=restarted_at)
    )
    assert second.outcome == "executed" and second.converged
    assert slurm.commands.count("requeuehold") == 2


def test_a_recommendation_that_does_not_say_whose_job_it_is_acts_on_nothing() -> None:
    slurm = ModelSlurm(running_job())
    outcome = controller_for(slurm).carry_out(restart(user="", submit_time=None))
    assert (slurm.commands, outcome.outcome) == ([], "failed")


@pytest.mark.parametrize(
    "attempt_started_at",
    [None, STARTED],
    ids=["attempt-never-started", "attempt-started-before-the-restart"],
)
def test_a_job_that_started_again_since_the_attempt_is_not_restarted_twice(
    attempt_started_at: datetime | None,
) -> None:
    """A node's death is seen twice: once for attempt 1 (restarted), once more for attempt 2,
    recorded while attempt 1's allocation was still completing. When that second
    recommendation is claimed, the job already runs again, restart count still 1."""
    slurm = ModelSlurm(
        running_job(restart_count=1, excluded_nodes=["gpu-002"], nodes=["gpu-003"],
                    submit_time=SUBMITTED + timedelta(hours=1),
                    start_time=STARTED + timedelta(hours=1))
    )  # fmt: skip
    recommendation = restart(attempt=2, attempt_started_at=attempt_started_at)
    outcome = controller_for(slurm).carry_out(recommendation)
    assert slurm.commands == []
    assert outcome.converged is False
    assert "nothing restarted" in outcome.detail


def test_a_job_cancelled_since_the_decision_is_not_brought_back() -> None:
    """Slurm requeues a cancelled job still in memory: a restart decided while the attempt
    ran, claimed after its owner's scancel, would revive a job someone ended on purpose."""
    slurm = ModelSlurm(running_job(state="CANCELLED"))
    outcome = controller_for(slurm).carry_out(restart())
    assert slurm.commands == []
    assert (outcome.outcome, outcome.converged) == ("skipped", False)
    assert "nothing restarted" in outcome.detail and "cancelled" in outcome.detail


def test_a_cancel_between_the_read_and_the_requeue_stops_the_restart() -> None:
    class CancelledOnDispatch(FakeAPI):
        def dispatch(self, recommendation_id: int, argv: Sequence[str], sequence: int) -> None:
            super().dispatch(recommendation_id, argv, sequence)
            assert slurm.job is not None
            slurm.job = restated(slurm.job, "CANCELLED")

    slurm = ModelSlurm(running_job(state="FAILED"))
    outcome = controller_for(slurm, CancelledOnDispatch()).carry_out(restart())
    assert slurm.commands == []
    assert outcome.converged is False
    assert "nothing restarted" in outcome.detail and "cancelled" in outcome.detail


def test_a_stop_for_an_attempt_slurm_has_restarted_since_stops_nothing() -> None:
    """Found by the chaos run: a stop decided for attempt 2's node failure was claimed after
    Slurm's own requeue had started attempt 3; Requeue=0 and scancel ended a job that was
    training."""
    slurm = ModelSlurm(running_job(restart_count=2, start_time=STARTED + timedelta(hours=1)))
    outcome = controller_for(slurm).carry_out(restart(action="stop", attempt=2))
    assert slurm.commands == []
    assert (outcome.outcome, outcome.converged) == ("skipped", False)
    assert "nothing stopped" in outcome.detail and "attempt 3" in outcome.detail


def test_a_stop_for_the_attempt_still_running_is_carried_out() -> None:
    slurm = ModelSlurm(running_job(restart_count=1))
    outcome = controller_for(slurm).carry_out(restart(action="stop", attempt=2))
    assert slurm.commands == ["update", "scancel"]
    assert (outcome.outcome, outcome.converged) == ("executed", True), outcome.detail


def test_a_job_still_completing_is_left_until_it_shows_what_it_becomes() -> None:
    slurm = ModelSlurm(running_job(state="COMPLETING"))
    outcome = controller_for(slurm).carry_out(restart())
    assert (slurm.commands, outcome.outcome) == ([], "retry")
    assert "still completing" in outcome.detail


def test_a_failed_attempt_that_finished_completing_is_restarted() -> None:
    class Ending(ModelSlurm):
        def get_job(self, job_id: str) -> JobInfo | None:
            job = super().get_job(job_id)
            if job is not None and job.native_state == "COMPLETING":
                self.job = restated(job, "FAILED")
            return job

    slurm = Ending(running_job(state="COMPLETING"))
    outcome = controller_for(slurm).carry_out(restart())
    assert (outcome.outcome, outcome.converged) == ("executed", True)
    assert slurm.commands == ["requeuehold", "update", "release"]


# ---------------------------------------------------------------------- read errors


def test_a_read_error_is_retried_with_backoff_and_the_restart_goes_ahead() -> None:
    slurm = ModelSlurm(running_job())
    slurm.read_errors = 2
    clock = Clock()
    outcome = controller_for(slurm, clock=clock, backoff_seconds=1.0).carry_out(restart())
    assert outcome.outcome == "executed" and outcome.converged
    assert clock.slept[:2] == [1.0, 2.0]


def test_a_scheduler_that_stays_unreachable_gives_the_recommendation_back() -> None:
    slurm = ModelSlurm(running_job())
    slurm.read_errors = 100
    outcome = controller_for(slurm, read_attempts=3).carry_out(restart())
    assert slurm.commands == []
    assert outcome.outcome == "retry"  # ready again, never FAILED for good
    assert "Connection reset" in outcome.detail


def test_a_restart_cut_off_after_requeuehold_is_finished_on_the_next_pass() -> None:
    slurm = ModelSlurm(running_job())
    slurm.drop_after = "update"  # the exclusion was set, then SSH dropped
    first = controller_for(slurm).carry_out(restart())
    assert first.outcome == "retry"
    assert [c["argv"][1] for c in first.commands] == ["requeuehold"]
    assert slurm.job is not None and slurm.job.held
    second = controller_for(slurm).carry_out(restart())
    assert (second.outcome, second.converged) == ("executed", True)
    assert slurm.commands == ["requeuehold", "update", "release"]  # no second requeue
    assert slurm.job.excluded_nodes == ["gpu-002"] and not slurm.job.held


def test_a_restart_cut_off_before_the_exclusion_sets_it_before_releasing() -> None:
    slurm = ModelSlurm(running_job())
    slurm.drop_after = "requeuehold"
    assert controller_for(slurm).carry_out(restart()).outcome == "retry"
    second = controller_for(slurm).carry_out(restart())
    assert second.converged
    assert slurm.commands == ["requeuehold", "update", "release"]


# ---------------------------------------------------------------------- bad values


def test_a_bad_node_name_fails_its_recommendation_before_any_command_and_the_rest_are_served() -> (
    None
):
    slurm = ModelSlurm(running_job())
    api = FakeAPI([restart(id=1, excluded_nodes=["-h"]), restart(id=2)])
    done = controller_for(slurm, api).run_once()
    assert done == [(1, "failed"), (2, "executed")]
    assert "refused before any command" in api.reports[0][1]["detail"]
    assert api.reports[0][1]["commands"] == []
    assert slurm.commands == ["requeuehold", "update", "release"]


@pytest.mark.parametrize("name", ["gpu$(id)", "x" * 100, "node[1-2]", "a b"])
def test_node_names_a_shell_or_slurm_would_misread_never_reach_a_command(name: str) -> None:
    slurm = ModelSlurm(running_job())
    outcome = controller_for(slurm).carry_out(restart(excluded_nodes=[name]))
    assert (slurm.commands, outcome.outcome) == ([], "failed")


def test_an_unexpected_error_in_one_recommendation_does_not_stop_the_others() -> None:
    class Exploding(ModelSlurm):
        def get_job(self, job_id: str) -> JobInfo | None:
            if job_id == "13":
                raise RuntimeError("surprise")
            return super().get_job(job_id)

    slurm = Exploding(running_job())
    api = FakeAPI([restart(id=1, job_id="13"), restart(id=2)])
    assert controller_for(slurm, api).run_once() == [(1, "retry"), (2, "executed")]


def test_a_claim_the_control_plane_fails_to_answer_is_skipped_until_the_next_pass() -> None:
    """
    GIVEN two ready recommendations, the control plane failing the first claim with a 500
    WHEN the controller makes a pass
    THEN the first is left for the next pass and the second is carried out
    """

    class Failing(FakeAPI):
        def claim(self, recommendation_id: int, lease_seconds: int) -> ReadyRecommendation:
            if recommendation_id == 1:
                raise AdvisorAPIError("POST claim: 500 Something went wrong", 500)
            return super().claim(recommendation_id, lease_seconds)

    api = Failing([restart(id=1, job_id="13"), restart(id=2)])
    assert controller_for(ModelSlurm(running_job()), api).run_once() == [(2, "executed")]
    assert [recommendation for recommendation, _ in api.reports] == [2]


def test_a_claim_refused_for_the_wrong_token_still_stops_the_controller() -> None:
    class Refusing(FakeAPI):
        def claim(self, recommendation_id: int, lease_seconds: int) -> ReadyRecommendation:
            raise AdvisorAPIError("POST claim: 403 not this cluster's token", 403)

    with pytest.raises(AdvisorAPIError):
        controller_for(ModelSlurm(running_job()), Refusing([restart(id=1)])).run_once()


# ---------------------------------------------------------------------- the lease


class SlowSlurm(ModelSlurm):
    """Every command takes 30 s, as on a busy slurmctld."""

    def __init__(self, job: JobInfo, clock: Clock) -> None:
        super().__init__(job)
        self.clock = clock

    def _done(self, *argv: str) -> CommandResult:
        self.clock.now += 30
        return super()._done(*argv)


def test_a_slow_restart_renews_its_lease_and_reports_every_command() -> None:
    clock = Clock()
    slurm = SlowSlurm(running_job(), clock)
    api = FakeAPI([restart()])
    controller = controller_for(slurm, api, clock, lease_seconds=60)
    assert controller.run_once() == [(1, "executed")]
    assert len(api.renewals) >= 2
    assert [c["argv"][1] for c in api.reports[0][1]["commands"]] == [
        "requeuehold",
        "update",
        "release",
    ]


def test_a_lost_lease_stops_the_action_and_says_what_was_done() -> None:
    clock = Clock()
    slurm = SlowSlurm(running_job(), clock)
    api = FakeAPI([restart()])
    # Taken over while the slow requeuehold ran: the next renewal finds it lost.
    slurm.after["requeuehold"] = lambda: setattr(api, "lease_lost", True)
    assert controller_for(slurm, api, clock, lease_seconds=60).run_once() == [(1, "retry")]
    assert slurm.commands == ["requeuehold"]  # nothing after the lease was found lost
    body = api.reports[0][1]
    assert "lease" in body["detail"]
    assert [c["argv"][1] for c in body["commands"]] == ["requeuehold"]


# ---------------------------------------------------------------------- start-up


def test_it_starts_only_where_token_flag_and_slurm_name_the_same_cluster() -> None:
    slurm = ModelSlurm(running_job(), cluster="lab")
    assert controller_for(slurm, FakeAPI()).check_identity("lab").cluster == "lab"
    with pytest.raises(MisconfiguredController, match="token belongs to cluster 'lab'"):
        controller_for(slurm, FakeAPI()).check_identity("prod")
    with pytest.raises(MisconfiguredController, match="scheduler here is cluster 'lab'"):
        controller_for(slurm, FakeAPI(scheduler_cluster_name="a100")).check_identity("lab")


def test_an_unreadable_cluster_name_is_asked_again_not_taken_for_a_misconfiguration() -> None:
    """A controller restarted while slurmctld is away must wait for it, not exit for good."""
    unnamed = ModelSlurm(running_job(), cluster=None)
    with pytest.raises(SchedulerError, match="did not report its cluster name"):
        controller_for(unnamed, FakeAPI()).check_identity("lab")
    with pytest.raises(SchedulerError, match="connection refused"):
        controller_for(SlurmAwayAtFirst(running_job()), FakeAPI()).check_identity("lab")


class SlurmAwayAtFirst(ModelSlurm):
    """slurmctld refuses the first ``away`` connections, then answers."""

    def __init__(self, job: JobInfo, away: int = 1) -> None:
        super().__init__(job, cluster="lab")
        self.away = away

    def cluster_name(self) -> str | None:
        if self.away > 0:
            self.away -= 1
            raise SchedulerError("connection refused")
        return self.cluster


def test_a_controller_started_during_a_scheduler_outage_waits_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by the chaos run: a controller restarted while the scheduler was unreachable
    exited with "not starting", and stayed down until something restarted it."""
    from recovery.controller import cli

    monkeypatch.setattr("recovery.controller.cli.time.sleep", lambda seconds: None)
    controller = controller_for(SlurmAwayAtFirst(running_job(), away=3), FakeAPI())
    out, err = io.StringIO(), io.StringIO()
    options = cli.ControllerOptions.from_parsed(
        {**vars(cli_parser().parse_args(["--cluster", "lab"]))}
    )
    cli.check_identity(controller, options, out=out, err=err)
    assert "serves cluster lab" in out.getvalue()
    assert err.getvalue().count("cannot check the cluster yet: connection refused") == 3


def test_a_controller_says_at_start_what_it_may_do_without_an_approval() -> None:
    from recovery.controller import cli

    class CanaryAPI(FakeAPI):
        def identity(self) -> ControllerIdentity:
            return ControllerIdentity(
                "lab", "lab", "controller:test", acts_without_approval="jobs in partition canary"
            )

    controller = controller_for(SlurmAwayAtFirst(running_job(), away=0), CanaryAPI())
    out, err = io.StringIO(), io.StringIO()
    options = cli.ControllerOptions.from_parsed(
        {**vars(cli_parser().parse_args(["--cluster", "lab"]))}
    )
    cli.check_identity(controller, options, out=out, err=err)
    assert "without an approval it acts on: jobs in partition canary" in out.getvalue()


def cli_parser() -> argparse.ArgumentParser:
    from recovery.controller import cli

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser


# ---------------------------------------------------------------------- Slurm 25.11


class ExpeditingSlurm(ModelSlurm):
    """A 25.11 site with enable_expedited_requeue, for jobs submitted with --requeue=expedite."""

    def __init__(self, job: JobInfo, *, job_expedites: bool = True) -> None:
        super().__init__(job)
        self.job_expedites = job_expedites

    def supports_expedited_requeue(self) -> bool:
        return True

    def requeue_expedited(self, job_id: str) -> CommandResult:
        if not self.job_expedites:
            raise ExpeditedRequeueUnavailable("not submitted with --requeue=expedite")
        self.job = restated(self._job(), "PENDING", held=False, restart_count=1, nodes=[])
        return self._done("scontrol", "requeue", job_id)


def test_a_restart_with_nothing_to_exclude_takes_the_expedited_path() -> None:
    slurm = ExpeditingSlurm(running_job())
    outcome = controller_for(slurm).carry_out(restart(action="restart", excluded_nodes=[]))
    assert (outcome.outcome, outcome.converged) == ("executed", True)
    assert slurm.commands == ["requeue"]  # no hold, no release, no requeue delay


def test_exclusions_or_a_job_without_the_flag_take_the_ordinary_path() -> None:
    excluding = ExpeditingSlurm(running_job())
    assert controller_for(excluding).carry_out(restart()).converged
    assert excluding.commands == ["requeuehold", "update", "release"]
    plain = ExpeditingSlurm(running_job(), job_expedites=False)
    assert controller_for(plain).carry_out(restart(action="restart", excluded_nodes=[])).converged
    assert plain.commands == ["requeuehold", "release"]


def test_a_restart_for_an_attempt_restarted_twice_since_leaves_the_later_hold_alone() -> None:
    """
    Found by the chaos run: a restart decided for attempt 1's node death was claimed after
    Slurm had started attempt 2, attempt 2 had failed, and another recommendation had requeued
    the job in held state to set its own exclusions.
    GIVEN the job pending and held at attempt 3 (restart count 2)
    WHEN the recommendation for attempt 1 is carried out
    THEN nothing runs: no exclusions of its own, and no release of the other's hold
    """
    slurm = ModelSlurm(
        running_job(state="PENDING", held=True, restart_count=2, nodes=[],
                    submit_time=SUBMITTED + timedelta(hours=2))
    )  # fmt: skip
    outcome = controller_for(slurm).carry_out(restart(attempt=1))
    assert slurm.commands == []
    assert (outcome.outcome, outcome.converged) == ("skipped", False)
    assert "nothing to do" in outcome.detail and "attempt 3" in outcome.detail


@pytest.mark.parametrize("state", ["RUNNING", "FAILED"])
def test_a_restart_whose_next_attempt_started_without_its_exclusions_runs_nothing(
    state: str,
) -> None:
    """
    GIVEN Slurm's own requeue started attempt 2 before the controller claimed attempt 1's
          restart, without the exclusion it asks for (and attempt 2 may have failed since)
    WHEN it is carried out
    THEN no exclusion is sent to a job that is not pending (Slurm refuses it, and it was
         retried for the whole settle time), and the operator is told why
    """
    slurm = ModelSlurm(
        running_job(state=state, restart_count=1, nodes=["gpu-003"],
                    submit_time=SUBMITTED + timedelta(hours=1),
                    start_time=STARTED + timedelta(hours=1))
    )  # fmt: skip
    outcome = controller_for(slurm).carry_out(restart(attempt=1))
    assert slurm.commands == []
    assert (outcome.outcome, outcome.converged) == ("skipped", False)
    assert "without excluding gpu-002" in outcome.detail


def test_a_requeued_job_still_pending_gets_the_exclusions_and_is_released() -> None:
    """Slurm's own requeue (or this restart's, by a controller killed after it) left the job
    pending at the next attempt: the restart is finished, not skipped."""
    slurm = ModelSlurm(
        running_job(state="PENDING", restart_count=1, nodes=[],
                    submit_time=SUBMITTED + timedelta(hours=1))
    )  # fmt: skip
    outcome = controller_for(slurm).carry_out(restart(attempt=1))
    assert slurm.commands == ["hold", "update", "release"]
    assert (outcome.outcome, outcome.converged) == ("executed", True), outcome.detail
