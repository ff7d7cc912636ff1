"""A crash a job printed is acted on only once the process is seen to end.

The job's output is a real file read by the production ingestion path; the scheduler is
scripted (the real Slurm path is in tests/e2e).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from recovery.audit.record import record_event
from recovery.choices import (
    AnomalyKind,
    AuditKind,
    ClusterMode,
    Confirmation,
    RecommendationAction,
)
from recovery.loop.confirmation import survival_step
from recovery.loop.logs import ingest_workload_logs
from recovery.loop.monitors import check_suspects
from recovery.loop.policy import decide_pending
from recovery.loop.poll import poll_cluster
from recovery.loop.push import LogBatch, ingest_log_batch
from recovery.models import Anomaly, AuditEvent, Cluster, Policy, Recommendation, Workload
from recovery.sources.schedulers.transport import LocalTransport
from tests.factories import ClusterFactory
from tests.fakes import Scripted, job

pytestmark = pytest.mark.django_db

CAUGHT = [
    "node002: ERROR:train.data:failed to load sample shard-00017/sample-004211, skipping it",
    "Traceback (most recent call last):",
    '  File "/workspace/train/data.py", line 88, in __getitem__',
    "    return self.decode(self.samples[key])",
    "KeyError: 'shard-00017/sample-004211'",
]
TASK_EXITED = "srun: error: node002: task 1: Exited with exit code 1"


def steps(*numbers: int, node: str = "node001") -> list[str]:
    return [f"{node}: step: {n}  loss: 2.3100  memory: 0.10GiB  tps: 5,231" for n in numbers]


class Job:
    """A running opted-in job whose output file the test appends to."""

    def __init__(self, cluster: Cluster, tmp_path: Path) -> None:
        self.cluster = cluster
        self.output = tmp_path / "job.out"
        self.output.write_text("")
        poll_cluster(cluster, Scripted([job(nodes=["node001", "node002"])]))
        self.workload = Workload.objects.get(cluster=cluster)
        Workload.objects.filter(pk=self.workload.pk).update(
            stdout_path=str(self.output), work_dir=str(tmp_path)
        )

    def prints(self, *lines: str) -> None:
        with self.output.open("a") as out:
            out.write("".join(f"{line}\n" for line in lines))

    def read(self, now: datetime | None = None) -> None:
        workload = Workload.objects.select_related("cluster").get(pk=self.workload.pk)
        ingest_workload_logs(workload, LocalTransport(), now=now or timezone.now())

    def anomaly(self) -> Anomaly:
        """The first crash recorded: the traceback."""
        crashes = Anomaly.objects.filter(workload=self.workload, kind=AnomalyKind.CRASH)
        return crashes.order_by("id").first()  # type: ignore[return-value]


@pytest.fixture
def cluster() -> Cluster:
    cluster = ClusterFactory(mode=ClusterMode.ACTION, acknowledge_scheduler_actions=True)
    Policy.objects.create(name="lab", cluster=cluster, blast_radius_percent=100)
    return cluster


@pytest.fixture
def training(cluster: Cluster, tmp_path: Path) -> Job:
    running = Job(cluster, tmp_path)
    running.prints(*steps(55, 56, 57))
    running.read()
    return running


def events(kind: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(kind=kind).order_by("id"))


def test_a_caught_exception_followed_by_more_steps_is_survived_and_kept(training: Job) -> None:
    """
    GIVEN a job training at step 57
    WHEN it logs a caught exception with its traceback and goes on to steps 58 and 59
    THEN the crash is recorded as survived, visibly, and nothing is recommended
    """
    training.prints(*CAUGHT, *steps(58, 59))
    training.read()

    anomaly = training.anomaly()
    assert anomaly.confirmation == Confirmation.SURVIVED
    assert "step 59" in anomaly.confirmation_reason
    assert anomaly.decided_at is not None
    assert not Recommendation.objects.exists()
    (survived,) = events(AuditKind.SURVIVED)
    assert survived.payload["anomaly"] == anomaly.pk
    assert events(AuditKind.DETECTED)[0].payload["confirmation"] == Confirmation.SURVIVED


def test_steps_read_later_clear_a_suspect(cluster: Cluster, training: Job) -> None:
    """
    GIVEN a traceback read alone: a suspected crash, nothing decided
    WHEN the next read shows two more steps
    THEN the crash is survived and nothing is recommended
    """
    training.prints(*CAUGHT)
    training.read()
    assert training.anomaly().confirmation == Confirmation.SUSPECTED
    assert check_suspects(cluster, timezone.now()) == []
    assert training.anomaly().confirmation == Confirmation.SUSPECTED

    training.prints(*steps(58, 59))
    training.read()
    check_suspects(cluster, timezone.now())
    decide_pending(cluster)

    assert training.anomaly().confirmation == Confirmation.SURVIVED
    assert not Recommendation.objects.exists()


def test_the_step_in_flight_on_other_ranks_is_not_survival(training: Job) -> None:
    """
    GIVEN rank 1 printed step 57 and raised
    WHEN rank 0 prints 57 (late) and 58 (the step in flight) after the traceback
    THEN that is not training going on: the crash stays suspected
    """
    training.prints(*CAUGHT, *steps(57, 58, node="node003"))
    training.read()
    assert training.anomaly().confirmation == Confirmation.SUSPECTED
    assert survival_step(57, [57, 58]) is None
    assert survival_step(57, [58, 59]) == 59
    assert survival_step(None, [3]) is None
    assert survival_step(1200, [0, 1]) == 1  # a counter that starts again each epoch


def test_a_traceback_and_srun_saying_the_task_exited_is_confirmed_at_once(
    training: Job,
) -> None:
    """
    GIVEN a job training
    WHEN it prints a traceback and srun reports the task's exit in the same read
    THEN the crash is confirmed and a restart is recommended in that read
    """
    training.prints(*CAUGHT, TASK_EXITED)
    training.read()

    anomaly = training.anomaly()
    assert anomaly.confirmation == Confirmation.CONFIRMED
    assert TASK_EXITED in anomaly.confirmation_reason
    assert anomaly.confirmation_latency_seconds is not None
    assert Recommendation.objects.get().action == RecommendationAction.RESTART
    (confirmed,) = events(AuditKind.CONFIRMED)
    assert confirmed.payload["anomaly"] == anomaly.pk


def test_an_exit_read_later_confirms_the_suspect(cluster: Cluster, training: Job) -> None:
    """
    GIVEN a suspected crash
    WHEN the next read has only srun's task-exit line
    THEN the suspect is confirmed and the policy decides on it, the cause
    """
    training.prints(*CAUGHT)
    training.read()
    training.prints(TASK_EXITED)
    training.read()
    check_suspects(cluster, timezone.now())

    suspect = training.anomaly()
    assert suspect.confirmation == Confirmation.CONFIRMED
    assert suspect.confirmation_reason.startswith("the attempt failed: srun: error")
    assert Recommendation.objects.get().action == RecommendationAction.RESTART


def test_the_job_leaving_running_confirms_the_suspect(cluster: Cluster, training: Job) -> None:
    """
    GIVEN a suspected crash
    WHEN the scheduler says the job failed
    THEN the suspect is confirmed by the attempt's end and decided; the bare FAILED adds
         nothing, the logs said more
    """
    training.prints(*CAUGHT)
    training.read()
    poll_cluster(cluster, Scripted([job(nodes=["node001", "node002"], state="FAILED")]))

    anomaly = training.anomaly()
    assert anomaly.confirmation == Confirmation.CONFIRMED
    assert "the attempt ended" in anomaly.confirmation_reason
    assert Recommendation.objects.get().anomaly == anomaly
    assert Anomaly.objects.count() == 1


def test_a_job_failing_after_a_survived_crash_still_gets_its_bare_failure(
    cluster: Cluster, training: Job
) -> None:
    """
    GIVEN a caught exception the job survived
    WHEN the job later fails with nothing more in its logs
    THEN the failure is recorded from the scheduler's word and acted on
    """
    training.prints(*CAUGHT, *steps(58, 59))
    training.read()
    poll_cluster(cluster, Scripted([job(nodes=["node001", "node002"], state="FAILED")]))

    scheduler = Anomaly.objects.exclude(confirmation=Confirmation.SURVIVED).get()
    assert scheduler.confirmation == Confirmation.CONFIRMED
    assert scheduler.details["source"] == "scheduler"
    assert Recommendation.objects.get().anomaly == scheduler


def test_silence_after_an_error_is_a_stall_decided_as_a_hang(
    cluster: Cluster, training: Job
) -> None:
    """
    GIVEN a suspected crash in a job that reports its steps
    WHEN nothing follows it for the confirmation window (10 s by default)
    THEN it is stalled, not confirmed: a hang is recorded after it and decided as a hang
    """
    training.prints(*CAUGHT)
    training.read()
    now = timezone.now()
    assert check_suspects(cluster, now + timedelta(seconds=9)) == []

    (hang,) = check_suspects(cluster, now + timedelta(seconds=11))

    crash = training.anomaly()
    assert crash.confirmation == Confirmation.STALLED
    assert hang.kind == AnomalyKind.HANG
    assert hang.details["stalled_after"] == crash.pk
    assert "KeyError" in hang.evidence_line
    recommendation = Recommendation.objects.get()
    assert (recommendation.anomaly, recommendation.action) == (hang, RecommendationAction.RESTART)
    assert events(AuditKind.STALLED)[0].payload["anomaly"] == crash.pk


def test_the_window_follows_the_jobs_own_step_time(cluster: Cluster, tmp_path: Path) -> None:
    """
    GIVEN a job whose steps take 20 s
    WHEN it prints a traceback and then nothing for 30 s
    THEN it is still suspected: three steps' time (60 s) has not passed
    """
    slow = Job(cluster, tmp_path)
    start = timezone.now() - timedelta(minutes=2)
    slow.prints(*[f"{(start + timedelta(seconds=20 * i)).isoformat()} {line}" for i, line in
                  enumerate(steps(1, 2, 3, 4))])  # fmt: skip
    slow.read()
    slow.prints(*CAUGHT)
    slow.read()
    now = timezone.now()
    assert check_suspects(cluster, now + timedelta(seconds=30)) == []
    assert slow.anomaly().confirmation == Confirmation.SUSPECTED
    assert len(check_suspects(cluster, now + timedelta(seconds=61))) == 1


def test_a_job_that_reports_no_progress_waits_for_the_process_to_end(
    cluster: Cluster, tmp_path: Path
) -> None:
    """
    GIVEN a job that prints no step lines
    WHEN it prints a traceback and then nothing for an hour
    THEN silence says nothing: the crash stays suspected until the job ends
    """
    quiet = Job(cluster, tmp_path)
    quiet.prints(*CAUGHT)
    quiet.read()
    assert check_suspects(cluster, timezone.now() + timedelta(hours=1)) == []
    assert quiet.anomaly().confirmation == Confirmation.SUSPECTED
    assert not Recommendation.objects.exists()


def test_a_job_that_completes_after_a_traceback_survived_it(
    cluster: Cluster, tmp_path: Path
) -> None:
    """
    GIVEN a job that prints no step lines and logged a caught exception
    WHEN the scheduler says it completed
    THEN the crash is survived, not confirmed, and nothing is recommended
    """
    quiet = Job(cluster, tmp_path)
    quiet.prints(*CAUGHT)
    quiet.read()
    poll_cluster(cluster, Scripted([job(nodes=["node001", "node002"], state="COMPLETED")]))

    anomaly = quiet.anomaly()
    assert (anomaly.confirmation, anomaly.confirmation_reason) == (
        Confirmation.SURVIVED,
        "the job completed",
    )
    assert not Recommendation.objects.exists()


def test_a_survived_crash_printed_again_before_dying_is_acted_on(training: Job) -> None:
    """
    GIVEN a caught exception the job survived
    WHEN the same traceback is printed again and this time srun reports the exit
    THEN the crash is suspected again, confirmed, and a restart is recommended
    """
    training.prints(*CAUGHT, *steps(58, 59))
    training.read()
    training.prints(*CAUGHT, TASK_EXITED)
    training.read()

    anomaly = training.anomaly()
    assert anomaly.confirmation == Confirmation.CONFIRMED
    assert anomaly.occurrences == 2
    assert Recommendation.objects.get().anomaly == anomaly
    assert [e.payload.get("again", False) for e in events(AuditKind.DETECTED)] == [False, True]


def test_the_schedulers_word_needs_no_confirmation(cluster: Cluster, training: Job) -> None:
    """
    GIVEN a running job
    WHEN the scheduler says the attempt ended OUT_OF_MEMORY
    THEN the anomaly is confirmed when recorded and decided at once
    """
    poll_cluster(cluster, Scripted([job(nodes=["node001", "node002"], state="OUT_OF_MEMORY")]))

    (anomaly,) = Anomaly.objects.all()
    assert anomaly.confirmation == Confirmation.CONFIRMED
    assert anomaly.confirmation_at == anomaly.detected_at
    assert Recommendation.objects.exists()


def test_pushed_log_batches_follow_the_same_rule(training: Job) -> None:
    """
    GIVEN a job pushing its log lines instead of writing a file
    WHEN a batch has a caught traceback followed by two more steps
    THEN the crash is survived and nothing is recommended
    """
    workload = Workload.objects.select_related("cluster").get(pk=training.workload.pk)
    ingest_log_batch(workload, LogBatch(lines=[*CAUGHT, *steps(58, 59)], node="node002"))

    assert training.anomaly().confirmation == Confirmation.SURVIVED
    assert not Recommendation.objects.exists()


def test_srun_reporting_the_steps_our_restart_stopped_is_no_new_crash(training: Job) -> None:
    """
    GIVEN an attempt a controller already requeued
    WHEN srun reports the step it aborted because of that requeue
    THEN no anomaly is recorded for it
    """
    record_event(
        cluster=training.cluster,
        workload=training.workload,
        attempt=1,
        kind=AuditKind.SCHEDULER_ACTION,
        actor="controller:test",
        payload={"action": "restart"},
    )
    training.prints("srun: Job step aborted: Waiting up to 7 seconds for job step to finish.")
    training.read()

    assert not Anomaly.objects.exists()


def test_the_confirmation_quotes_the_task_that_died_not_its_stopped_peers(training: Job) -> None:
    """
    GIVEN a traceback, srun saying the task exited, then its peers being stopped
    WHEN the read is recorded
    THEN the confirmation names the task that exited, after the detection in the trail
    """
    training.prints(
        *CAUGHT,
        TASK_EXITED,
        "0: slurmstepd-node001: error: *** STEP 4242.0 ON node001 CANCELLED AT "
        "2026-12-01T10:00:00 ***",
        "srun: error: node001: task 0: Terminated",
    )
    training.read()

    assert training.anomaly().confirmation_reason == f"exit reported: {TASK_EXITED}"
    kinds = [e.kind for e in AuditEvent.objects.order_by("occurred_at", "id")]
    assert kinds.index(AuditKind.DETECTED) < kinds.index(AuditKind.CONFIRMED)
