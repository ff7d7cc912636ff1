"""Faults injected into real three-node torch.distributed jobs, and the end state each must reach.

Every scenario runs the production loop (poller, policy, Advisor Controller over HTTP) against the
local Slurm cluster and records its figures in var/e2e/report.json, passed or not.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db.models import QuerySet
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from recovery.choices import (
    AnomalyKind,
    AuditKind,
    ClusterMode,
    Confirmation,
    RecommendationAction,
    RecommendationStatus,
    StopReason,
    WorkloadState,
)
from recovery.models import Anomaly, AuditEvent, Node, Policy, Recommendation, Workload
from tests.e2e.harness import Harness
from tests.e2e.job import CKPT_EVERY, E2EJob
from tests.e2e.slurm_view import expand_nodes, slurm

pytestmark = [pytest.mark.django_db(transaction=True)]

RESUMED = re.compile(r"resuming from checkpoint at iteration (\d+) \(restart (\d+)\)")
SAVED = re.compile(r"successfully saved checkpoint from iteration (\d+)")
RESTARTS = {RecommendationAction.RESTART, RecommendationAction.RESTART_EXCLUDING}
# The smallest hang timeout a policy allows.
HANG_TIMEOUT_S = 60
# Scenario 9's job is short enough to be waited for to its end.
CAUGHT_TOTAL_STEPS = 120
# Scenarios 15 and 16 wait for their jobs' ends too; a few steps after the pause show it passed.
PAUSED_TOTAL_STEPS = 50
STEPS_AFTER_PAUSE = 20
# An evaluation pass after a handled error: many times the job's median step (0.3 to 1 s here).
QUIET_SECONDS = 25
# A slow synchronous checkpoint save.
SAVE_SECONDS = 30
# A timestamped line of the job's log: "1: 2026-11-29T18:00:01.123Z node002: <message>".
LOG_LINE = re.compile(r"^ *(?:\d+: )?(\d{4}-\d\d-\d\dT[\d:.]+)Z \S+: (.*)$", re.MULTILINE)


def acted(scenario: Harness, job: E2EJob) -> list[Recommendation]:
    return list(
        Recommendation.objects.filter(
            workload__cluster=scenario.cluster,
            workload__job_id=job.job_id,
            status__in=[RecommendationStatus.EXECUTED, RecommendationStatus.SKIPPED],
        ).order_by("created_at", "pk")
    )


def scheduler_actions(scenario: Harness, job: E2EJob) -> list[AuditEvent]:
    return list(
        AuditEvent.objects.filter(
            workload__cluster=scenario.cluster,
            workload__job_id=job.job_id,
            kind=AuditKind.SCHEDULER_ACTION,
        ).order_by("occurred_at", "pk")
    )


def acted_on(scenario: Harness, job: E2EJob) -> str | None:
    """Why a job that was meant to be left alone is known to have been acted on, if it was."""
    if not scheduler_actions(scenario, job):
        return None
    return "a job that kept training was acted on: " + "; ".join(
        f"{r.action} ({r.reason}; anomaly: {r.anomaly.evidence_line if r.anomaly else None})"
        for r in acted(scenario, job)
    )


def logged_at(job: E2EJob, message: re.Pattern[str]) -> list[datetime]:
    """When the job printed a line whose message (after its time and node) matches."""
    return [
        datetime.fromisoformat(m.group(1))
        for m in LOG_LINE.finditer(job.log())
        if message.match(m.group(2))
    ]


def resumed_after(job: E2EJob, restart: int) -> int | None:
    """The checkpoint step attempt ``restart + 1`` said it resumed from."""
    steps = [int(m.group(1)) for m in RESUMED.finditer(job.log()) if int(m.group(2)) == restart]
    return steps[0] if steps else None


def assert_resumed_and_progressed(job: E2EJob, checkpoint_before: int, restart: int = 1) -> None:
    resumed = resumed_after(job, restart)
    assert resumed is not None and resumed >= checkpoint_before, job.log()[-3000:]
    saved = [int(m.group(1)) for m in SAVED.finditer(job.log())]
    assert max(saved) > resumed, "the new attempt saved no later checkpoint"


def test_1_a_killed_rank_is_restarted_from_its_checkpoint(scenario: Harness) -> None:
    """
    GIVEN a three-node job training and checkpointing
    WHEN one rank's process is killed with SIGKILL
    THEN the crash is detected, the job is restarted once and resumes from its checkpoint
    """
    scenario.setup("1-rank-killed")
    job = scenario.submit()
    before = scenario.wait_until_training(job)
    scenario.kill_rank(job, 1)

    fields = scenario.wait_for_restart(job)

    assert int(fields["Restarts"]) == 1
    assert [r.action in RESTARTS for r in acted(scenario, job)] == [True]
    assert len(scheduler_actions(scenario, job)) == 1
    assert_resumed_and_progressed(job, before.last_checkpoint_step or 0)


def test_2_a_dead_node_is_excluded_from_the_restart(scenario: Harness) -> None:
    """
    GIVEN a three-node job training and checkpointing
    WHEN one of its nodes dies: its slurmd and every process of the job there killed at once
    THEN a node failure is detected and the job restarts from its checkpoint without that node
    """
    scenario.setup("2-node-death")
    job = scenario.submit()
    before = scenario.wait_until_training(job)
    node = job.ranks()[1].env["SLURMD_NODENAME"]
    try:
        scenario.kill_node(job, node)
        fields = scenario.wait_for_restart(job, timeout=150)
        scenario.record(log_tail=_tail_around_failure(job))
    finally:
        scenario.revive_node(node)

    executed = acted(scenario, job)
    assert executed, "no recommendation was carried out"
    assert node in executed[-1].excluded_nodes, executed[-1].reason
    assert node in expand_nodes(scenario.slurm, fields.get("ExcNodeList", ""))
    assert node not in expand_nodes(scenario.slurm, fields.get("NodeList", ""))
    assert len(scheduler_actions(scenario, job)) == 1
    assert Anomaly.objects.filter(
        workload__job_id=job.job_id, implicated_nodes__contains=node
    ).exists()
    assert_resumed_and_progressed(job, before.last_checkpoint_step or 0)


def test_3_a_stopped_rank_is_detected_as_a_hang_and_restarted(scenario: Harness) -> None:
    """
    GIVEN a three-node job training and checkpointing, with a one-minute hang timeout
    WHEN one rank is stopped with SIGSTOP, so every rank waits in the all-reduce
    THEN a hang is detected within the timeout plus five seconds, and the job is restarted
    """
    scenario.setup("3-hang", hang_timeout_minutes=1)
    scenario.anomaly_kind = AnomalyKind.HANG
    job = scenario.submit()
    before = scenario.wait_until_training(job)
    injection = scenario.kill_rank(job, 1, signal.SIGSTOP)
    scenario.record(hang_threshold_s=HANG_TIMEOUT_S)

    hang = scenario.wait_for(
        "a hang anomaly",
        lambda: Anomaly.objects.filter(workload__job_id=job.job_id, kind=AnomalyKind.HANG).first(),
        timeout=HANG_TIMEOUT_S + 60,
    )
    fields = scenario.wait_for_restart(job)

    assert (hang.detected_at - injection.at).total_seconds() <= HANG_TIMEOUT_S + 5
    assert int(fields["Restarts"]) == 1
    assert len(scheduler_actions(scenario, job)) == 1
    assert_resumed_and_progressed(job, before.last_checkpoint_step or 0)


def test_4_a_cuda_error_with_an_xid_on_the_node_excludes_that_node(scenario: Harness) -> None:
    """
    GIVEN a three-node job training and checkpointing
    WHEN one node's kernel log reports Xid 79 and that node's rank dies with a CUDA error
    THEN the verdict is hardware on that node, and the job restarts without it; and when then
         another job on the cluster loses a rank, its restart keeps that node out too
    """
    scenario.setup("4-xid-hardware")
    job = scenario.submit()
    before = scenario.wait_until_training(job)
    node = job.ranks()[1].env["SLURMD_NODENAME"]
    scenario.inject(job, "Xid 79 in the kernel log, CUDA error on its rank", node=node)
    line = scenario.xid(node)
    job.set_faults(cuda_error={"node": node, "restart_count": 0})
    scenario.record(kernel_line=line)

    fields = scenario.wait_for_restart(job)

    executed = acted(scenario, job)
    assert executed, "no recommendation was carried out"
    assert executed[-1].anomaly is not None
    assert executed[-1].anomaly.attribution == "hardware", executed[-1].reason
    assert node in executed[-1].anomaly.implicated_nodes
    assert node in executed[-1].excluded_nodes
    assert node in expand_nodes(scenario.slurm, fields.get("ExcNodeList", ""))
    assert node not in expand_nodes(scenario.slurm, fields.get("NodeList", ""))
    assert len(scheduler_actions(scenario, job)) == 1
    assert Node.objects.get(cluster=scenario.cluster, name=node).health == "unhealthy"
    assert_resumed_and_progressed(job, before.last_checkpoint_step or 0)

    # Job A leaves the nodes to job B, which may land on the unhealthy node: Slurm sees it fine.
    slurm(scenario.slurm, "scancel", job.job_id)
    other = scenario.submit()
    scenario.wait_until_training(other)
    scenario.kill_rank(other, 1)
    fields = scenario.wait_for_restart(other)
    (restart,) = acted(scenario, other)
    assert restart.exclusion_sources.get(node) == "cluster: unhealthy", restart.reason
    assert node in expand_nodes(scenario.slurm, fields.get("ExcNodeList", ""))
    assert node not in expand_nodes(scenario.slurm, fields.get("NodeList", ""))


def test_5_an_exception_on_every_attempt_stops_after_the_policy_budget(
    scenario: Harness,
) -> None:
    """
    GIVEN a job that trained and checkpointed, with a policy of two attempts without checkpoint
    WHEN its data pipeline raises the same exception early in every attempt
    THEN it is restarted while retries may pay off, then stopped (the workload STOPPED, with a
         ``stopped`` event naming the reason), and no new checkpoint appears
    """
    scenario.setup("5-app-exception", max_attempts_without_checkpoint=2)
    job = scenario.submit()
    before = scenario.wait_until_training(job)
    scenario.inject(job, "KeyError in the data loader on every attempt")
    job.set_faults(app_exception={"after_steps": 2})

    stop = scenario.wait_for(
        "a stop recommendation carried out",
        lambda: Recommendation.objects.filter(
            workload__job_id=job.job_id,
            action=RecommendationAction.STOP,
            status__in=[RecommendationStatus.EXECUTED, RecommendationStatus.SKIPPED],
        ).first(),
        timeout=150,
    )
    time.sleep(3)  # anything still to come would show now

    fields = job.slurm_state()
    assert fields["JobState"] in {"FAILED", "CANCELLED"}, fields
    workload = scenario.workload(job)
    assert workload is not None
    assert workload.state == WorkloadState.STOPPED, workload.state_reason
    (stopped,) = AuditEvent.objects.filter(workload=workload, kind=AuditKind.STOPPED)
    assert stopped.payload["stop_reason"] == StopReason.NO_CHECKPOINT
    restarts = [r for r in acted(scenario, job) if r.action in RESTARTS]
    # Attempt 1 had saved checkpoints; attempts 2 and 3 saved none, which is the budget.
    assert len(restarts) == 2 and int(fields["Restarts"]) == 2, fields
    assert stop.attempt is not None and stop.attempt.number == 3
    assert not AuditEvent.objects.filter(
        workload=workload, kind=AuditKind.CHECKPOINT_SAVED, attempt__gt=1
    ).exists()
    # The attempts after the fault resumed from the checkpoint attempt 1 had saved.
    resumed = resumed_after(job, 1)
    assert resumed is not None and before.last_checkpoint_step is not None
    assert resumed_after(job, 2) == resumed >= before.last_checkpoint_step


def test_6_a_slowed_rank_is_flagged_as_a_straggler_on_its_node(scenario: Harness) -> None:
    """
    GIVEN a three-node job training, with a 20 % straggler threshold over one minute
    WHEN one rank's compute becomes three times slower
    THEN a straggler anomaly names that rank's node, and nothing touches the scheduler
    """
    scenario.setup(
        "6-straggler",
        straggler_threshold_percent=20,
        straggler_window_minutes=1,
        straggler_action="record",
    )
    scenario.anomaly_kind = AnomalyKind.STRAGGLER
    job = scenario.submit()
    scenario.wait_until_training(job)
    node = job.ranks()[2].env["SLURMD_NODENAME"]
    scenario.inject(job, "rank 2 three times slower", node=node)
    job.set_faults(slow={"node": node, "factor": 3.0})

    straggler = scenario.wait_for(
        "a straggler anomaly",
        lambda: Anomaly.objects.filter(
            workload__job_id=job.job_id, kind=AnomalyKind.STRAGGLER
        ).first(),
        timeout=180,
    )

    assert straggler.implicated_nodes == [node], straggler.implicated_nodes
    assert scheduler_actions(scenario, job) == []
    assert int(job.slurm_state().get("Restarts", "0")) == 0


def test_7_monitor_mode_records_then_acts_once_on_approval(
    scenario: Harness, operator: User
) -> None:
    """
    GIVEN a cluster in monitor mode
    WHEN a rank of a job is killed
    THEN a recommendation waits for approval and nothing touches the scheduler; once an
         operator approves it, it is carried out exactly once
    """
    scenario.setup("7-monitor-approval", mode=ClusterMode.MONITOR)
    _waits_for_approval_then_acts_once(scenario, operator, scenario.submit())


def _waits_for_approval_then_acts_once(scenario: Harness, operator: User, job: E2EJob) -> None:
    before = scenario.wait_until_training(job)
    scenario.kill_rank(job, 1)

    waiting = scenario.wait_for(
        "a recommendation awaiting approval",
        lambda: Recommendation.objects.filter(
            workload__job_id=job.job_id, status=RecommendationStatus.AWAITING_APPROVAL
        ).first(),
        timeout=60,
    )
    time.sleep(5)  # the controller runs every half second meanwhile
    assert scheduler_actions(scenario, job) == []
    assert int(job.slurm_state().get("Restarts", "0")) == 0
    scenario.record(actions_before_approval=0)

    api = APIClient()
    api.force_authenticate(operator)
    url = reverse("api:recommendation-approve", args=[waiting.pk])
    answers = [api.post(url, {"note": "e2e"}, format="json") for _ in range(2)]  # a double click
    assert [a.status_code for a in answers] == [200, 200], answers[0].content[:500]
    assert [a.json()["changed"] for a in answers] == [True, False]
    scenario.record(approved_through="POST /api/v1/recommendations/<id>/approve/ (twice)")
    fields = scenario.wait_for_restart(job)
    time.sleep(3)

    assert int(fields["Restarts"]) == 1
    assert len(scheduler_actions(scenario, job)) == 1
    assert (
        AuditEvent.objects.filter(workload__job_id=job.job_id, kind=AuditKind.APPROVED).count() == 1
    )
    assert_resumed_and_progressed(job, before.last_checkpoint_step or 0)


def test_8_a_controller_killed_mid_recovery_restarts_the_job_exactly_once(
    scenario: Harness, tmp_path: Any
) -> None:
    """
    GIVEN a controller process carrying out the restart of a crashed job
    WHEN it is killed with SIGKILL after requeueing the job held, and started again
    THEN the job is restarted exactly once, and released by the second controller
    """
    cluster = scenario.setup("8-controller-killed", controller=False)
    token_file = tmp_path / "token"
    token_file.write_text(scenario.token)
    command = [
        sys.executable, "manage.py", "advisor_controller", "--cluster", cluster.name,
        "--url", scenario.live_server_url, "--token-file", str(token_file),
        "--interval", "0.5", "--lease-seconds", "10", *scenario.slurm.controller_args(),
    ]  # fmt: skip
    logs = tmp_path / "controllers.log"

    def start() -> subprocess.Popen[bytes]:
        with logs.open("ab") as out:
            return subprocess.Popen(
                command, cwd=settings.BASE_DIR, stdout=out, stderr=subprocess.STDOUT
            )

    job = scenario.submit()
    before = scenario.wait_until_training(job)
    first = start()
    second: subprocess.Popen[bytes] | None = None
    try:
        scenario.kill_rank(job, 1)
        killed_at = _kill_between_requeue_and_release(scenario, job, first)
        scenario.record(controller_killed=killed_at)
        second = start()
        fields = scenario.wait_for_restart(job)
        time.sleep(2)
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                os.kill(process.pid, signal.SIGKILL)
                process.wait()

    requeues_in_reports = sum(
        1
        for event in scheduler_actions(scenario, job)
        for command_run in event.payload.get("commands", [])
        if command_run["argv"][1:2] in (["requeue"], ["requeuehold"])
    )
    log = (scenario.slurm.directory / "log" / "slurmctld.log").read_text(errors="replace")
    requeues_by_slurm = len(re.findall(rf"Requeuing JobId={job.job_id}\b", log))
    scenario.record(
        requeues_in_reports=requeues_in_reports,
        requeues_by_slurmctld=requeues_by_slurm,
        controller_output=logs.read_text(errors="replace")[-2000:],
    )
    assert int(fields["Restarts"]) == 1
    assert requeues_by_slurm == 1
    assert requeues_in_reports <= 1
    assert [r.status for r in acted(scenario, job)] in (
        [RecommendationStatus.EXECUTED],
        [RecommendationStatus.SKIPPED],
    )
    assert_resumed_and_progressed(job, before.last_checkpoint_step or 0)


def test_9_a_caught_exception_does_not_restart_a_job_that_keeps_training(
    scenario: Harness,
) -> None:
    """
    GIVEN a three-node job training and checkpointing
    WHEN one rank logs a caught exception with its full traceback, at two different steps, and
         goes on training
    THEN the job trains to its end with no restart and nothing sent to the scheduler, and the
         error stays in the trail as a crash that was survived
    """
    scenario.setup("9-caught-exception")
    job = scenario.submit(total_steps=CAUGHT_TOTAL_STEPS)
    scenario.wait_until_training(job)
    node = job.ranks()[1].env["SLURMD_NODENAME"]
    # The ranks may be a step or two ahead of what srun has written to the log so far.
    step = job.last_step()
    at_steps = [step + 6, step + 24]
    assert at_steps[-1] + 40 <= CAUGHT_TOTAL_STEPS, f"the job started late: step {step}"
    scenario.inject(
        job, "caught KeyError with its traceback at two steps, on rank 1", node=node, steps=at_steps
    )
    job.set_faults(caught_exception={"rank": 1, "at_steps": at_steps})

    fields = scenario.wait_until_finished(job, timeout=150, unless=lambda: acted_on(scenario, job))

    workload, anomalies, trail = _trail(scenario, job)
    scenario.record(log_tail=_tail_around_failure(job))
    assert job.log().count("ERROR:train.data:") == 2, job.log()[-3000:]
    _assert_untouched(scenario, job, workload, fields)
    _assert_survived(workload, anomalies, trail)


def test_10_a_traceback_then_the_death_of_the_rank_restarts_the_job_once(
    scenario: Harness,
) -> None:
    """
    GIVEN a three-node job training and checkpointing
    WHEN one rank prints a traceback and its process exits with status 1
    THEN the crash is confirmed by the rank's death, and the job is restarted once and resumes
         from its checkpoint
    """
    scenario.setup("10-traceback-then-death")
    job = scenario.submit()
    before = scenario.wait_until_training(job)
    node = job.ranks()[1].env["SLURMD_NODENAME"]
    scenario.inject(job, "KeyError traceback on rank 1, then exit status 1", node=node)
    job.set_faults(traceback_then_exit={"rank": 1, "restart_count": 0})

    fields = scenario.wait_for_restart(job)
    time.sleep(3)  # a second action would show now
    scenario.record(log_tail=_tail_around_failure(job))

    executed = acted(scenario, job)
    assert [r.action in RESTARTS for r in executed] == [True], [r.reason for r in executed]
    basis = executed[0].anomaly
    assert basis is not None, executed[0].reason
    assert basis.confirmation == Confirmation.CONFIRMED, (
        basis.signature,
        basis.confirmation,
        basis.confirmation_reason,
    )
    assert int(fields["Restarts"]) == 1
    assert len(scheduler_actions(scenario, job)) == 1
    assert_resumed_and_progressed(job, before.last_checkpoint_step or 0)


def test_11_an_error_then_a_hang_is_restarted_as_a_hang(scenario: Harness) -> None:
    """
    GIVEN a three-node job training and checkpointing, with the default 30-minute hang timeout
    WHEN one rank prints the traceback of a failed storage read and then blocks without exiting,
         so every other rank waits in the all-reduce
    THEN the error is not acted on as a crash: with neither an exit nor progress after it, it
         stalls, a hang is recorded and the job is restarted once, on the hang, from its
         checkpoint
    """
    scenario.setup("11-error-then-hang", hang_timeout_minutes=30)
    scenario.anomaly_kind = AnomalyKind.HANG
    job = scenario.submit()
    before = scenario.wait_until_training(job)
    node = job.ranks()[1].env["SLURMD_NODENAME"]
    injection = scenario.inject(
        job, "RuntimeError traceback of a storage read on rank 1, then it blocks", node=node
    )
    job.set_faults(error_then_hang={"rank": 1, "restart_count": 0})
    # Within this long after the error the rank must exit or train on (three median steps are
    # about 1 s here, so the policy's seconds decide).
    policy = Policy.objects.get(cluster=scenario.cluster, environment=scenario.environment)
    scenario.record(stall_window_s=policy.crash_confirmation_seconds)

    fields = scenario.wait_for_restart(job)
    time.sleep(3)  # a second action would show now
    scenario.record(log_tail=_tail_around_failure(job))

    executed = acted(scenario, job)
    assert [r.action in RESTARTS for r in executed] == [True], [r.reason for r in executed]
    basis = executed[0].anomaly
    assert basis is not None, executed[0].reason
    crashes = Anomaly.objects.filter(workload=basis.workload, kind=AnomalyKind.CRASH)
    trail = [
        (a.signature, a.confirmation, a.confirmation_reason, a.evidence_line[:120]) for a in crashes
    ]
    actions = scheduler_actions(scenario, job)
    hang_after = (basis.detected_at - injection.at).total_seconds()
    scenario.record(
        hang_after_error_s=round(hang_after, 2),
        restart_after_error_s=round((actions[0].occurred_at - injection.at).total_seconds(), 2)
        if actions
        else None,
    )
    assert basis.kind == AnomalyKind.HANG, (basis.signature, executed[0].reason, trail)
    # The stalled path, not the hang detector: that would wait the policy's 30 minutes.
    assert hang_after <= HANG_TIMEOUT_S, (basis.detected_at, trail)
    assert crashes.filter(confirmation=Confirmation.STALLED).exists(), trail
    assert int(fields["Restarts"]) == 1
    assert len(scheduler_actions(scenario, job)) == 1
    assert_resumed_and_progressed(job, before.last_checkpoint_step or 0)


def _trail(scenario: Harness, job: E2EJob) -> tuple[Workload, QuerySet[Anomaly], list[Any]]:
    """The job's workload, its anomalies, and what they were, for assertion messages."""
    workload = scenario.workload(job)
    assert workload is not None
    anomalies = Anomaly.objects.filter(workload=workload)
    trail = [
        (a.kind, a.signature, a.confirmation, a.confirmation_reason, a.evidence_line[:120])
        for a in anomalies
    ]
    return workload, anomalies, trail


def _assert_untouched(
    scenario: Harness, job: E2EJob, workload: Workload, fields: dict[str, str]
) -> None:
    """The job trained to its end with no restart, nothing sent to the scheduler and no
    recommendation to act."""
    assert fields["JobState"] == "COMPLETED", fields
    assert int(fields["Restarts"]) == 0, fields
    assert scheduler_actions(scenario, job) == []
    assert [r.action for r in Recommendation.objects.filter(workload=workload)] in (
        [],
        [RecommendationAction.NONE],
    )


def _assert_survived(workload: Workload, anomalies: QuerySet[Anomaly], trail: list[Any]) -> None:
    """The error is in the trail as a crash the job survived, never confirmed, stalled or hung."""
    assert anomalies.filter(confirmation=Confirmation.SURVIVED).exists(), trail
    assert not anomalies.filter(
        confirmation__in=[Confirmation.CONFIRMED, Confirmation.STALLED]
    ).exists(), trail
    assert not anomalies.filter(kind=AnomalyKind.HANG).exists(), trail
    assert AuditEvent.objects.filter(workload=workload, kind=AuditKind.SURVIVED).exists()


def _kill_between_requeue_and_release(
    scenario: Harness, job: E2EJob, process: subprocess.Popen[bytes]
) -> str:
    """SIGKILL the controller once Slurm shows the job requeued and held, before its release.

    The controller is frozen with SIGSTOP while Slurm is read, so that it cannot release the
    job between the look and the kill.
    """
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        os.kill(process.pid, signal.SIGSTOP)
        fields = job.slurm_state()
        restarted = int(fields.get("Restarts", "0") or 0) >= 1
        held = fields.get("Reason", "") == "job_requeued_in_held_state" or (
            fields.get("Priority") == "0"
        )
        if restarted:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
            where = "after requeuehold, before release" if held else "after release"
            if scenario.timeline is not None:
                scenario.timeline.note(f"controller killed {where}")
            return where
        os.kill(process.pid, signal.SIGCONT)
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    raise AssertionError("the controller never requeued the job")


def _tail_around_failure(job: E2EJob) -> str:
    """What srun and the surviving ranks printed when the node died (progress lines left out)."""
    lines = [
        line
        for line in job.log().splitlines()
        if " step: " not in line and "saving checkpoint" not in line
    ]
    return "\n".join(lines[-60:])


def test_12_a_job_opted_in_to_be_observed_waits_for_approval_in_an_acting_cluster(
    scenario: Harness, operator: User
) -> None:
    """
    GIVEN an acknowledged action-mode cluster and a job opted in with "mode": "observe"
    WHEN a rank of the job is killed
    THEN its recommendation waits for approval and nothing touches the scheduler; once an
         operator approves it, it is carried out exactly once
    """
    scenario.setup("12-observed-job")
    _waits_for_approval_then_acts_once(scenario, operator, scenario.submit(mode="observe"))


def test_13_a_workflows_next_job_keeps_its_exclusions_and_budget(scenario: Harness) -> None:
    """
    GIVEN two jobs of one workflow (the same "workflow" in their comments) and a policy of four
          attempts; job A lost a rank to a CUDA error with Xid 79 on its node, and was restarted
          without that node, then cancelled
    WHEN job B, the workflow's next job, loses a rank, and after its restart loses one again
    THEN B's restart keeps A's node out as an earlier attempt of the workflow, and B's second
         failure stops it on the retry budget: A's two attempts and B's two spend the four
    """
    scenario.setup("13-workflow", max_attempts=4)
    first = scenario.submit(workflow="pretrain-e2e")
    scenario.wait_until_training(first)
    node = first.ranks()[1].env["SLURMD_NODENAME"]
    scenario.inject(first, "Xid 79 in the kernel log, CUDA error on its rank", node=node)
    scenario.xid(node)
    first.set_faults(cuda_error={"node": node, "restart_count": 0})
    fields = scenario.wait_for_restart(first)
    assert node in expand_nodes(scenario.slurm, fields.get("ExcNodeList", ""))
    slurm(scenario.slurm, "scancel", first.job_id)

    second = scenario.submit(workflow="pretrain-e2e")
    scenario.wait_until_training(second)
    workload_a, workload_b = scenario.workload(first), scenario.workload(second)
    assert workload_a is not None and workload_b is not None
    assert workload_b.workflow is not None and workload_b.workflow == workload_a.workflow
    assert workload_b.workflow.name == "pretrain-e2e"

    scenario.kill_rank(second, 1)
    fields = scenario.wait_for_restart(second)
    (restart,) = acted(scenario, second)
    assert restart.exclusion_sources.get(node) == "earlier attempt", restart.reason
    assert node in expand_nodes(scenario.slurm, fields.get("ExcNodeList", ""))
    assert node not in expand_nodes(scenario.slurm, fields.get("NodeList", ""))

    scenario.kill_rank(second, 1)
    stop = scenario.wait_for(
        "a stop recommendation carried out",
        lambda: Recommendation.objects.filter(
            workload__cluster=scenario.cluster,
            workload__job_id=second.job_id,
            action=RecommendationAction.STOP,
            status__in=[RecommendationStatus.EXECUTED, RecommendationStatus.SKIPPED],
        ).first(),
        timeout=120,
    )
    assert stop.stop_reason == StopReason.RETRY_BUDGET, stop.reason
    assert stop.attempt is not None and stop.attempt.number == 2
    scenario.wait_for(
        "job B stopped",
        lambda: scenario.workload(second).state == WorkloadState.STOPPED,  # type: ignore[union-attr]
        timeout=60,
    )
    assert int(second.slurm_state()["Restarts"]) == 1


def test_14_a_job_submitted_after_another_follows_it_in_one_workflow(scenario: Harness) -> None:
    """
    GIVEN job A, restarted without the node its Xid 79 and CUDA error implicated, and job B
          submitted with --dependency=afterany on A, neither naming a workflow
    WHEN A ends and B runs and loses a rank
    THEN B recorded the dependency while it waited, the two jobs are one workflow (a chain
         named after A), and B's restart keeps A's node out as an earlier attempt
    """
    scenario.setup("14-dependency", max_attempts=6)
    first = scenario.submit()
    scenario.wait_until_training(first)
    node = first.ranks()[1].env["SLURMD_NODENAME"]
    scenario.inject(first, "Xid 79 in the kernel log, CUDA error on its rank", node=node)
    scenario.xid(node)
    first.set_faults(cuda_error={"node": node, "restart_count": 0})
    scenario.wait_for_restart(first)

    second = scenario.submit(after=f"afterany:{first.job_id}")
    scenario.wait_for(
        "job B seen waiting on job A",
        lambda: (w := scenario.workload(second)) is not None and w.depends_on == [first.job_id],
        timeout=30,
    )
    slurm(scenario.slurm, "scancel", first.job_id)
    scenario.wait_until_training(second)
    workload_a, workload_b = scenario.workload(first), scenario.workload(second)
    assert workload_a is not None and workload_b is not None
    assert workload_b.workflow is not None and workload_b.workflow == workload_a.workflow
    assert workload_b.workflow.name.startswith(f"chain-{first.job_id}-")

    scenario.kill_rank(second, 1)
    fields = scenario.wait_for_restart(second)
    (restart,) = acted(scenario, second)
    assert restart.exclusion_sources.get(node) == "earlier attempt", restart.reason
    assert node in expand_nodes(scenario.slurm, fields.get("ExcNodeList", ""))
    assert node not in expand_nodes(scenario.slurm, fields.get("NodeList", ""))


def test_15_a_handled_error_then_a_quiet_step_does_not_restart_the_job(
    scenario: Harness,
) -> None:
    """
    GIVEN a three-node job training and checkpointing, with the default 30-minute hang timeout
    WHEN one rank logs a handled error with its traceback, and right after that step takes 25 s
         longer on every rank, as an evaluation pass does: every process alive, nothing printed,
         many times the job's median step
    THEN the job trains to its end with no restart and nothing sent to the scheduler, no hang
         is recorded, and the error stays in the trail as a crash that was survived
    """
    scenario.setup("15-handled-then-quiet", hang_timeout_minutes=30)
    job = scenario.submit(total_steps=PAUSED_TOTAL_STEPS)
    scenario.wait_until_training(job)
    node = job.ranks()[1].env["SLURMD_NODENAME"]
    # The ranks may be a step or two ahead of what srun has written to the log so far.
    at_step = job.last_step() + 6
    assert at_step + STEPS_AFTER_PAUSE <= PAUSED_TOTAL_STEPS, f"the job started late: {at_step}"
    scenario.inject(
        job,
        f"handled KeyError with its traceback on rank 1, then a {QUIET_SECONDS} s quiet step",
        node=node,
        step=at_step,
    )
    job.set_faults(
        handled_then_quiet={"rank": 1, "at_step": at_step, "quiet_seconds": QUIET_SECONDS}
    )

    fields = scenario.wait_until_finished(job, timeout=150, unless=lambda: acted_on(scenario, job))

    workload, anomalies, trail = _trail(scenario, job)
    # The silence the loop saw: from the error to the first rank's line of the quiet step.
    (error_at,) = logged_at(job, re.compile(r"ERROR:train\.data:"))
    resumed_at = min(logged_at(job, re.compile(rf"step: {at_step}\b")))
    quiet = (resumed_at - error_at).total_seconds()
    scenario.record(quiet_after_error_s=round(quiet, 2), log_tail=_tail_around_failure(job))
    assert quiet >= QUIET_SECONDS, job.log()[-3000:]
    _assert_untouched(scenario, job, workload, fields)
    _assert_survived(workload, anomalies, trail)


def test_16_a_slow_checkpoint_save_is_neither_a_stall_nor_a_hang(scenario: Harness) -> None:
    """
    GIVEN a three-node job training and checkpointing, with the default policy
    WHEN one checkpoint save takes 30 s: rank 0 prints that it starts saving and writes for
         30 s while every other rank waits in the next all-reduce; no error is printed
    THEN the job trains to its end with no restart and nothing sent to the scheduler, and
         neither a hang nor a straggler is recorded
    """
    scenario.setup("16-slow-checkpoint")
    job = scenario.submit(total_steps=PAUSED_TOTAL_STEPS)
    scenario.wait_until_training(job)
    # A step that saves a checkpoint anyway, a few steps ahead of the ranks.
    at_step = -(-(job.last_step() + 6) // CKPT_EVERY) * CKPT_EVERY
    assert at_step + STEPS_AFTER_PAUSE <= PAUSED_TOTAL_STEPS, f"the job started late: {at_step}"
    scenario.inject(job, f"a {SAVE_SECONDS} s checkpoint save on rank 0", step=at_step)
    job.set_faults(checkpoint_pause={"at_step": at_step, "seconds": SAVE_SECONDS})

    fields = scenario.wait_until_finished(job, timeout=150, unless=lambda: acted_on(scenario, job))

    workload, anomalies, trail = _trail(scenario, job)
    (began,) = logged_at(job, re.compile(rf"saving checkpoint at iteration {at_step} "))
    saved_line = re.compile(rf"successfully saved checkpoint from iteration {at_step} ")
    (saved,) = logged_at(job, saved_line)
    save = (saved - began).total_seconds()
    scenario.record(checkpoint_save_s=round(save, 2))
    assert save >= SAVE_SECONDS, job.log()[-3000:]
    _assert_untouched(scenario, job, workload, fields)
    assert not anomalies.filter(kind__in=[AnomalyKind.HANG, AnomalyKind.STRAGGLER]).exists(), trail


# Scenario 17: the canary partition of deploy/slurm-dev/slurm.conf.in has two of the four nodes.
CANARY_PARTITION = "canary"
OTHER_PARTITION = "debug"
CANARY_NODES_PER_JOB = 2
# How long the job outside the canary is watched untouched, its recommendation waiting.
UNTOUCHED_SECONDS = 5


def test_17_a_canary_partition_acts_while_the_rest_awaits_approval(
    scenario: Harness, operator: User
) -> None:
    """
    GIVEN an acknowledged action-mode cluster whose canary is the partition "canary" (set with
          a reason, in the trail), a controller with no partition of its own, and two two-node
          jobs opted in with "mode": "act" training at once, one in "canary", one in "debug"
    WHEN a rank of each is killed
    THEN the canary job is restarted by the controller without an approval and resumes from its
         checkpoint; the debug job's recommendation awaits approval and nothing touches it in
         the scheduler meanwhile; once an operator approves it, it is restarted exactly once
    """
    from recovery.audit.cluster_controls import save_with_audit
    from tests.e2e.figures import scenario_figures

    cluster = scenario.setup("17-canary-partition")
    cluster.action_partitions = [CANARY_PARTITION]
    reason = "e2e: action mode on the canary partition first"
    (scope_changed,) = save_with_audit(cluster, operator.username, cluster.save, reason)
    assert scope_changed.kind == AuditKind.ACTION_SCOPE_CHANGED
    assert scope_changed.payload["to"] == {"partitions": [CANARY_PARTITION], "share_percent": 100}

    canary = scenario.submit(nodes=CANARY_NODES_PER_JOB, partition=CANARY_PARTITION)
    other = scenario.submit(nodes=CANARY_NODES_PER_JOB, partition=OTHER_PARTITION)
    canary_before = scenario.wait_until_training(canary)
    other_before = scenario.wait_until_training(other)
    assert (canary_before.partition, other_before.partition) == (CANARY_PARTITION, "debug")
    assert canary_before.acts_automatically and not other_before.acts_automatically
    canary_nodes = expand_nodes(scenario.slurm, canary.slurm_state().get("NodeList", ""))
    other_nodes = expand_nodes(scenario.slurm, other.slurm_state().get("NodeList", ""))
    assert len(canary_nodes) == len(other_nodes) == CANARY_NODES_PER_JOB
    assert set(canary_nodes) <= {"node001", "node002"}, canary_nodes
    scenario.record(
        canary_job_id=canary.job_id,
        other_job_id=other.job_id,
        nodes={canary.job_id: canary_nodes, other.job_id: other_nodes},
        scope_reason=reason,
    )

    other_injection = scenario.kill_rank(other, 1)
    canary_injection = scenario.kill_rank(canary, 1)

    fields = scenario.wait_for_restart(canary)
    waiting = scenario.wait_for(
        "a recommendation awaiting approval for the job outside the canary",
        lambda: Recommendation.objects.filter(
            workload__cluster=scenario.cluster,
            workload__job_id=other.job_id,
            status=RecommendationStatus.AWAITING_APPROVAL,
        ).first(),
        timeout=60,
    )
    # Untouched for a while after its recommendation, the controller running every half second.
    waited = (datetime.now(waiting.created_at.tzinfo) - waiting.created_at).total_seconds()
    time.sleep(max(0.0, UNTOUCHED_SECONDS - waited))
    assert scheduler_actions(scenario, other) == []
    assert int(other.slurm_state().get("Restarts", "0") or 0) == 0
    waiting.refresh_from_db()
    assert waiting.status == RecommendationStatus.AWAITING_APPROVAL
    untouched = (datetime.now(waiting.created_at.tzinfo) - waiting.created_at).total_seconds()

    (canary_restart,) = acted(scenario, canary)
    assert canary_restart.action in RESTARTS, canary_restart.reason
    assert canary_restart.status == RecommendationStatus.EXECUTED
    assert canary_restart.approved_by == "", canary_restart.approved_by
    assert int(fields["Restarts"]) == 1
    assert len(scheduler_actions(scenario, canary)) == 1
    assert_resumed_and_progressed(canary, canary_before.last_checkpoint_step or 0)
    recommended = AuditEvent.objects.get(
        kind=AuditKind.RECOMMENDED, payload__recommendation=waiting.pk
    )
    assert recommended.payload["would_have_done"] is True, recommended.payload
    scenario.record(
        canary_restart_attempt=int(fields["Restarts"]) + 1,
        canary_resumed_from=resumed_after(canary, 1),
        other_untouched_s=round(untouched, 2),
        actions_on_other_before_approval=0,
    )

    api = APIClient()
    api.force_authenticate(operator)
    url = reverse("api:recommendation-approve", args=[waiting.pk])
    answers = [api.post(url, {"note": "e2e"}, format="json") for _ in range(2)]  # a double click
    assert [a.status_code for a in answers] == [200, 200], answers[0].content[:500]
    assert [a.json()["changed"] for a in answers] == [True, False]
    approved_at = time.time()
    scenario.injection = other_injection
    other_fields = scenario.wait_for_restart(other)
    restarted_after_approval = time.time() - approved_at
    time.sleep(3)  # a second action on either job would show now

    assert int(other.slurm_state()["Restarts"]) == int(other_fields["Restarts"]) == 1
    assert int(canary.slurm_state()["Restarts"]) == 1
    assert len(scheduler_actions(scenario, other)) == 1
    assert len(scheduler_actions(scenario, canary)) == 1
    assert [r.pk for r in acted(scenario, other)] == [waiting.pk]
    approvals = AuditEvent.objects.filter(
        workload__cluster=scenario.cluster, kind=AuditKind.APPROVED
    )
    assert [e.workload.job_id for e in approvals if e.workload] == [other.job_id]
    assert_resumed_and_progressed(other, other_before.last_checkpoint_step or 0)
    scenario.record(
        approved_through="POST /api/v1/recommendations/<id>/approve/ (twice)",
        other_restart_after_approval_s=round(restarted_after_approval, 2),
        other_figures=scenario_figures(scenario.workload(other), other_injection),
    )
    # The report row's figures are the canary job's (the first submitted), from its injection.
    scenario.injection = canary_injection

    # The readiness page reads the same run: the canary acted alone, the rest by approval.
    assert scenario.cluster is not None
    browser = Client()
    browser.force_login(operator)
    page = browser.get(reverse("console:readiness", args=[scenario.cluster.pk]), {"days": 1})
    assert page.status_code == 200
    report = page.context["report"]
    halves = {half.half: half for half in report.halves}
    assert halves["canary"].carried_out_without_approval == 1, halves
    assert (halves["monitor"].approved, halves["monitor"].carried_out_without_approval) == (1, 0)
    assert report.counts.approved == 1
    scenario.record(readiness_recommended={h: f.recommended for h, f in halves.items()})
