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
from recovery.loop.monitors import check_progress, check_suspects
from recovery.loop.policy import decide_pending
from recovery.loop.poll import poll_cluster
from recovery.loop.push import LogBatch, ingest_log_batch
from recovery.models import Anomaly, AuditEvent, Cluster, Policy, Recommendation, Workload
from recovery.schedulers.transport import LocalTransport
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
# A prefetch thread nothing caught: the thread is gone, the process is not.
THREAD_DIED = [
    "node002: Exception in thread shard-prefetch:",
    "Traceback (most recent call last):",
    '  File "/usr/lib/python3.11/threading.py", line 1045, in _bootstrap_inner',
    "    self.run()",
    '  File "/workspace/train/data.py", line 73, in read_shard',
    '    raise RuntimeError(f"read of {path} failed after {tries} tries")',
    "RuntimeError: read of /lustre/datasets/web-2024/shard-00042.tar failed after 3 tries",
]


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

    def workload_now(self) -> Workload:
        return Workload.objects.select_related("cluster").get(pk=self.workload.pk)

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


def test_silence_after_a_thread_died_is_a_stall_decided_as_a_hang(
    cluster: Cluster, training: Job
) -> None:
    """
    GIVEN a job that reports its steps, quick ones, and has shown no long quiet phase
    WHEN a thread dies on an exception nothing caught, and nothing follows for the
         confirmation window (10 s by default)
    THEN it is stalled, not confirmed: a hang is recorded after it and decided as a hang
    """
    training.prints(*THREAD_DIED)
    training.read()
    now = timezone.now()
    assert check_suspects(cluster, now + timedelta(seconds=9)) == []

    (hang,) = check_suspects(cluster, now + timedelta(seconds=11))

    crash = training.anomaly()
    assert crash.details["printed"] == "thread_died"
    assert crash.confirmation == Confirmation.STALLED
    assert hang.kind == AnomalyKind.HANG
    assert hang.details["stalled_after"] == crash.pk
    assert hang.details["stall_basis"] == "confirmation seconds"
    assert "read of /lustre" in hang.evidence_line
    recommendation = Recommendation.objects.get()
    assert (recommendation.anomaly, recommendation.action) == (hang, RecommendationAction.RESTART)
    assert events(AuditKind.STALLED)[0].payload["anomaly"] == crash.pk


def test_silence_after_a_handled_error_is_left_to_the_hang_rules(
    cluster: Cluster, training: Job
) -> None:
    """
    GIVEN a job training at step 57, with the default 30-minute hang timeout
    WHEN it logs an error it handled (a logging record, then the traceback from the function
         that caught it) and then goes quiet, as for an evaluation pass
    THEN the silence is no stall, at 11 s or at 25 minutes: the error stays suspected, nothing
         is recommended; past the hang timeout the hang rules record a hang, as on any silence
    """
    training.prints(*CAUGHT)
    training.read()
    now = timezone.now()
    assert check_suspects(cluster, now + timedelta(seconds=11)) == []
    assert check_suspects(cluster, now + timedelta(minutes=25)) == []
    crash = training.anomaly()
    assert crash.details["printed"] == "handled"
    assert crash.confirmation == Confirmation.SUSPECTED
    assert check_progress(training.workload_now(), now + timedelta(minutes=25)) == []
    assert not Recommendation.objects.exists()

    (hang,) = check_progress(training.workload_now(), now + timedelta(minutes=31))
    assert hang.kind == AnomalyKind.HANG and hang.signature == "no-progress"


def test_a_quiet_phase_no_longer_than_the_jobs_own_is_not_a_stall(
    cluster: Cluster, tmp_path: Path
) -> None:
    """
    GIVEN a job with 1 s steps that once went 40 s without a step (an evaluation pass)
    WHEN a thread dies and nothing follows for 45 s
    THEN it is still suspected (the job has shown quiet phases of 40 s: 1.5 x 40 s = 60 s is
         allowed); after 61 s it is a stall, and the hang says what set its window
    """
    job_ = Job(cluster, tmp_path)
    start = timezone.now() - timedelta(minutes=3)
    times = [0, 1, 2, 42, 43, 44]
    job_.prints(*[f"{(start + timedelta(seconds=t)).isoformat()} {line}" for t, line in
                  zip(times, steps(1, 2, 3, 4, 5, 6), strict=True)])  # fmt: skip
    job_.read()
    assert job_.workload_now().longest_quiet_seconds == pytest.approx(40)
    job_.prints(*THREAD_DIED)
    job_.read()
    now = timezone.now()
    assert check_suspects(cluster, now + timedelta(seconds=45)) == []
    assert job_.anomaly().confirmation == Confirmation.SUSPECTED

    (hang,) = check_suspects(cluster, now + timedelta(seconds=61))
    assert hang.details["stall_basis"] == "longest quiet phase"
    assert hang.details["allowed_seconds"] == pytest.approx(60)


def test_a_checkpoint_announced_after_the_error_is_not_a_stall(
    cluster: Cluster, training: Job
) -> None:
    """
    GIVEN a job training at step 57
    WHEN a thread dies, and rank 0 then announces a checkpoint save and is quiet for 5 minutes
    THEN the error is not stalled: the save is a phase the hang rules judge, with their grace;
         the saved line ends the phase, and silence from then on counts again
    """
    training.prints(*THREAD_DIED, "node001: saving checkpoint at iteration 57 to /ckpt")
    training.read()
    now = timezone.now()
    assert training.workload_now().quiet_phase == "checkpoint"
    assert check_suspects(cluster, now + timedelta(minutes=5)) == []
    assert check_progress(training.workload_now(), now + timedelta(minutes=45)) == []

    training.prints("node001: successfully saved checkpoint from iteration 57 to /ckpt")
    training.read()
    assert training.workload_now().quiet_phase == ""
    # Counted from the save's end, not from the error (the soak's false restart, 4 s after a
    # 40 s save ended).
    assert check_suspects(cluster, timezone.now() + timedelta(seconds=5)) == []
    assert len(check_suspects(cluster, now + timedelta(minutes=5))) == 1


def test_the_window_follows_the_jobs_own_step_time(cluster: Cluster, tmp_path: Path) -> None:
    """
    GIVEN a job whose steps take 20 s
    WHEN a thread dies and then nothing for 40 s
    THEN it is still suspected: three steps' time (60 s) has not passed
    """
    slow = Job(cluster, tmp_path)
    start = timezone.now() - timedelta(minutes=2)
    slow.prints(*[f"{(start + timedelta(seconds=20 * i)).isoformat()} {line}" for i, line in
                  enumerate(steps(1, 2, 3, 4))])  # fmt: skip
    slow.read()
    slow.prints(*THREAD_DIED)
    slow.read()
    now = timezone.now()
    assert check_suspects(cluster, now + timedelta(seconds=40)) == []
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


def test_a_handled_error_printed_again_by_a_dying_thread_can_stall(
    cluster: Cluster, training: Job
) -> None:
    """
    GIVEN a handled error the job survived
    WHEN the same exception is printed again, this time by a thread nothing caught
    THEN silence after it is read by the new printing: it stalls after the window
    """
    training.prints(*CAUGHT, *steps(58, 59))
    training.read()
    assert training.anomaly().confirmation == Confirmation.SURVIVED
    training.prints(*THREAD_DIED[:-1], CAUGHT[-1])
    training.read()

    crash = training.anomaly()
    assert crash.details["printed"] == "thread_died"
    assert crash.confirmation == Confirmation.SUSPECTED
    assert len(check_suspects(cluster, timezone.now() + timedelta(seconds=11))) == 1


def test_a_handled_error_left_to_the_hang_rules_adds_no_second_restart(
    cluster: Cluster, training: Job
) -> None:
    """
    GIVEN a handled error followed by silence past the hang timeout, restarted as a hang
    WHEN the scheduler shows the job requeued by that restart, and the error's suspicion is
         settled by the attempt's end
    THEN the restart on the hang is the only action: the error's confirmation adds none
    """
    training.prints(*CAUGHT)
    training.read()
    now = timezone.now()
    (hang,) = check_progress(training.workload_now(), now + timedelta(minutes=31))
    (restart,) = Recommendation.objects.all()
    assert restart.anomaly == hang and restart.action == RecommendationAction.RESTART
    record_event(
        cluster=cluster,
        workload=training.workload,
        attempt=1,
        kind=AuditKind.SCHEDULER_ACTION,
        actor="controller:c1",
        payload={"recommendation": restart.pk, "action": restart.action, "outcome": "executed"},
    )
    poll_cluster(
        cluster,
        Scripted([job(nodes=["node001", "node002"], state="PENDING", restart_count=1)]),
    )
    check_suspects(cluster, now + timedelta(minutes=32))

    crash = training.anomaly()
    assert crash.confirmation == Confirmation.SURVIVED
    assert "the scheduler ended the attempt (requeued), not this error" in (
        crash.confirmation_reason
    )
    assert [r.pk for r in Recommendation.objects.exclude(action=RecommendationAction.NONE)] == [
        restart.pk
    ]


@pytest.mark.parametrize("ended_as", ["PREEMPTED", "CANCELLED", "requeued by an administrator"])
def test_an_attempt_someone_else_ended_does_not_confirm_its_suspect(
    cluster: Cluster, training: Job, ended_as: str
) -> None:
    """
    GIVEN a handled error, suspected, and a quiet checkpoint save after it
    WHEN an administrator requeues the job, it is preempted, or its user cancels it
    THEN the end is not the error's: the suspect is settled without confirmation, and nothing
         is recommended on it (a preemption Slurm did not requeue is the scheduler's own
         anomaly, decided as such)
    """
    training.prints(*CAUGHT, "node001: saving checkpoint at iteration 57 to /ckpt")
    training.read()
    if ended_as == "requeued by an administrator":
        seen = job(nodes=["node001", "node002"], state="PENDING", restart_count=1)
    else:
        seen = job(nodes=["node001", "node002"], state=ended_as)
    poll_cluster(cluster, Scripted([seen]))
    check_suspects(cluster, timezone.now() + timedelta(seconds=30))

    crash = training.anomaly()
    assert crash.confirmation == Confirmation.SURVIVED, crash.confirmation_reason
    assert "not this error" in crash.confirmation_reason
    assert not Recommendation.objects.filter(anomaly=crash).exists()


UNCAUGHT = [
    "node002: Traceback (most recent call last):",
    'node002:   File "/workspace/train/main.py", line 212, in <module>',
    "node002:     main()",
    'node002:   File "/workspace/train/main.py", line 170, in main',
    "node002:     loss = model(batch)",
    "node002: ValueError: expected sequence of length 4096 at dim 1 (got 2048)",
]


def test_an_uncaught_error_is_confirmed_by_any_end_of_its_attempt(
    cluster: Cluster, training: Job
) -> None:
    """
    GIVEN a traceback that ended the program's top level, suspected
    WHEN the job is requeued (its own script, or Slurm, did it after the crash)
    THEN the end is taken for the error's: confirmed and decided as a crash
    """
    training.prints(*UNCAUGHT)
    training.read()
    poll_cluster(
        cluster,
        Scripted([job(nodes=["node001", "node002"], state="PENDING", restart_count=1)]),
    )
    check_suspects(cluster, timezone.now() + timedelta(seconds=30))

    crash = training.anomaly()
    assert crash.details["printed"] == "top_level"
    assert crash.confirmation == Confirmation.CONFIRMED, crash.confirmation_reason


def test_a_handled_error_is_not_confirmed_by_another_error_that_ended_the_attempt(
    cluster: Cluster, training: Job
) -> None:
    """
    GIVEN a handled error on node002, suspected
    WHEN another error ends the attempt (an uncaught one, then srun's task exit)
    THEN the handled one is settled as survived, naming the other, and only the other is
         decided on: the handled error's nodes are not blamed for an end it did not cause
    """
    training.prints(*CAUGHT)
    training.read()
    training.prints(*UNCAUGHT, TASK_EXITED)
    training.read()
    check_suspects(cluster, timezone.now() + timedelta(seconds=30))

    handled, uncaught = Anomaly.objects.filter(kind=AnomalyKind.CRASH).order_by("id")[:2]
    assert handled.confirmation == Confirmation.SURVIVED, handled.confirmation_reason
    assert "the attempt failed on another error" in handled.confirmation_reason
    assert uncaught.confirmation == Confirmation.CONFIRMED
    assert not Recommendation.objects.filter(anomaly=handled).exists()


def on(node: str, lines: list[str]) -> list[str]:
    return [f"{node}: {line.removeprefix('node002: ')}" for line in lines]


def test_a_survived_crash_seen_again_on_another_node_implicates_only_that_node(
    training: Job,
) -> None:
    """
    GIVEN a caught exception on node002 the job survived
    WHEN the same error is printed on node001 and this time srun reports the exit
    THEN the crash is confirmed on node001 alone: node002 went on training after it
    """
    training.prints(*on("node002", CAUGHT), *steps(58, 59))
    training.read()
    assert training.anomaly().implicated_nodes == ["node002"]
    training.prints(*on("node001", CAUGHT), "srun: error: node001: task 0: Exited with exit code 1")
    training.read()

    anomaly = training.anomaly()
    assert anomaly.confirmation == Confirmation.CONFIRMED
    assert anomaly.implicated_nodes == ["node001"]


JOB_CANCELLED = "slurmstepd: error: *** JOB 4242 ON node001 CANCELLED AT 2026-12-05T04:40:00 ***"


@pytest.mark.parametrize("same_read", [True, False])
def test_an_owners_cancel_read_before_the_scheduler_shows_it_confirms_no_handled_error(
    cluster: Cluster, training: Job, same_read: bool
) -> None:
    """
    GIVEN a handled error, then a checkpoint save after it (the job is quiet)
    WHEN its owner cancels the job, and slurmstepd's notice is read before the poll shows the
         job CANCELLED (in the error's read, or the next)
    THEN the notice settles nothing on its own: the error is not confirmed and nothing is
         recommended, and once the scheduler shows the cancel the error is survived
    """
    training.prints(*CAUGHT, "node002: saving checkpoint at iteration 57 to /ckpt")
    if not same_read:
        training.read()
    training.prints(JOB_CANCELLED)
    training.read()
    # The poll lags: the decisions' grace for a cause has long passed.
    later = timezone.now() + timedelta(minutes=2)
    check_suspects(cluster, later)
    decide_pending(cluster, later)

    crash = training.anomaly()
    assert crash.confirmation == Confirmation.SUSPECTED, crash.confirmation_reason
    assert not Recommendation.objects.exclude(action=RecommendationAction.NONE).exists()

    poll_cluster(cluster, Scripted([job(nodes=["node001", "node002"], state="CANCELLED")]))
    check_suspects(cluster, timezone.now() + timedelta(minutes=3))
    decide_pending(cluster, timezone.now() + timedelta(minutes=3))

    crash = training.anomaly()
    assert crash.confirmation == Confirmation.SURVIVED, crash.confirmation_reason
    assert not Recommendation.objects.exclude(action=RecommendationAction.NONE).exists()


def test_an_uncaught_error_then_a_cancel_is_left_to_the_cancel(
    cluster: Cluster, training: Job
) -> None:
    """
    GIVEN a traceback that ended the program's top level
    WHEN the job's owner cancels it and the notice is read before the poll shows it
    THEN nothing is recommended on the notice alone, nor once the job shows CANCELLED: a
         cancelled job is its owner's to restart
    """
    training.prints(*UNCAUGHT, JOB_CANCELLED)
    training.read()
    later = timezone.now() + timedelta(minutes=2)
    check_suspects(cluster, later)
    decide_pending(cluster, later)
    assert not Recommendation.objects.exclude(action=RecommendationAction.NONE).exists()

    poll_cluster(cluster, Scripted([job(nodes=["node001", "node002"], state="CANCELLED")]))
    check_suspects(cluster, timezone.now() + timedelta(minutes=3))
    decide_pending(cluster, timezone.now() + timedelta(minutes=3))
    assert not Recommendation.objects.exclude(action=RecommendationAction.NONE).exists()
