"""Output files are read from their last offset into the detectors, each byte once."""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from recovery.choices import AuditKind
from recovery.loop.logs import ingest_workload_logs
from recovery.models import Anomaly, Attempt, AuditEvent, LogCursor, Recommendation, Workload
from recovery.schedulers.transport import LocalTransport
from tests.factories import WorkloadFactory

pytestmark = pytest.mark.django_db

XID = "Nov 29 03:14:15 node002 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n"
PROGRESS = " iteration {step:8d}/     100 | lm loss: 2.5 |\n"
SAVED = "successfully saved checkpoint from iteration {step:8d} to /ckpt\n"


@pytest.fixture
def workload(tmp_path: Path) -> Workload:
    workload = WorkloadFactory(
        stdout_path=str(tmp_path / "job.out"),
        work_dir=str(tmp_path),
        user_uid=os.getuid(),
        current_attempt=1,
    )
    Attempt.objects.create(workload=workload, number=1)
    return workload


def write(workload: Workload, text: str, mode: str = "a") -> None:
    with Path(workload.stdout_path).open(mode) as handle:
        handle.write(text)


def test_each_line_is_read_once_and_a_partial_line_waits(workload: Workload) -> None:
    write(workload, PROGRESS.format(step=1) + XID + "NVRM: Xid (PCI:0000:3b:00): 7")
    first = ingest_workload_logs(workload, LocalTransport())
    assert first.anomalies_new == 1
    cursor = LogCursor.objects.get()
    assert cursor.offset == len((PROGRESS.format(step=1) + XID).encode())

    write(workload, "9, pid=1, GPU has fallen off the bus.\n")
    second = ingest_workload_logs(workload, LocalTransport())
    assert second.anomalies_new == 0
    anomaly = Anomaly.objects.get()
    assert anomaly.category == "gpu_hardware"
    assert anomaly.occurrences == 2
    assert anomaly.implicated_nodes == ["node002"]
    assert AuditEvent.objects.filter(kind=AuditKind.DETECTED).count() == 1
    assert ingest_workload_logs(workload, LocalTransport()).bytes_read == 0


def test_a_truncated_file_is_read_again_from_the_start(workload: Workload) -> None:
    write(workload, "".join(PROGRESS.format(step=s) for s in range(1, 50)))
    ingest_workload_logs(workload, LocalTransport())
    write(workload, "OSError: [Errno 116] Stale file handle\n", mode="w")
    summary = ingest_workload_logs(workload, LocalTransport())
    assert summary.truncations == 1
    assert Anomaly.objects.get().category == "storage_io"
    assert LogCursor.objects.get().truncations == 1


def test_progress_and_checkpoints_reach_the_workload(workload: Workload) -> None:
    write(workload, PROGRESS.format(step=5) + SAVED.format(step=5) + PROGRESS.format(step=6))
    summary = ingest_workload_logs(workload, LocalTransport())
    workload.refresh_from_db()
    assert summary.checkpoints == 1
    assert workload.last_progress_step == 6
    assert workload.last_checkpoint_step == 5
    assert Attempt.objects.get().produced_checkpoint
    assert AuditEvent.objects.get(kind=AuditKind.CHECKPOINT_SAVED).payload["step"] == 5
    ingest_workload_logs(workload, LocalTransport())
    assert AuditEvent.objects.filter(kind=AuditKind.CHECKPOINT_SAVED).count() == 1


def test_progress_after_a_restart_is_recorded_once(workload: Workload) -> None:
    Attempt.objects.create(workload=workload, number=2, started_at=timezone.now())
    Workload.objects.filter(pk=workload.pk).update(current_attempt=2)
    workload.refresh_from_db()
    write(workload, PROGRESS.format(step=6))
    ingest_workload_logs(workload, LocalTransport())
    write(workload, PROGRESS.format(step=7))
    ingest_workload_logs(workload, LocalTransport())
    resumed = AuditEvent.objects.get(kind=AuditKind.PROGRESS_RESUMED)
    assert (resumed.attempt, resumed.payload["step"]) == (2, 6)


def test_a_missing_file_is_not_an_error(workload: Workload) -> None:
    assert ingest_workload_logs(workload, LocalTransport()).bytes_read == 0
    assert not LogCursor.objects.exists()


def test_binary_garbage_is_read_without_error(workload: Workload) -> None:
    Path(workload.stdout_path).write_bytes(bytes(range(256)) * 100 + b"\n" + XID.encode())
    assert ingest_workload_logs(workload, LocalTransport()).anomalies_new == 1


def test_a_node_kernel_log_ties_an_xid_to_the_workloads_on_that_node(tmp_path: Path) -> None:
    """
    GIVEN a cluster whose nodes' kernel logs are files, and two running workloads
    WHEN node002's kernel log shows an Xid 79
    THEN only the workload running on node002 gets the anomaly, and node002 is unhealthy
    """
    from recovery.choices import Connection, NodeHealth, WorkloadState
    from recovery.loop.logs import ingest_node_kernel_logs
    from recovery.models import Node
    from tests.factories import ClusterFactory

    cluster = ClusterFactory(
        connection=Connection.LOCAL,
        connection_settings={"node_kernel_log": str(tmp_path / "{node}" / "kern.log")},
    )
    for name in ("node001", "node002"):
        Node.objects.create(cluster=cluster, name=name)
        (tmp_path / name).mkdir()
        (tmp_path / name / "kern.log").write_text("kernel: usb 1-1: new device\n")
    on_2 = WorkloadFactory(cluster=cluster, state=WorkloadState.RUNNING, current_attempt=1)
    Attempt.objects.create(workload=on_2, number=1, nodes=["node002", "node003"])
    on_1 = WorkloadFactory(cluster=cluster, state=WorkloadState.RUNNING, current_attempt=1)
    Attempt.objects.create(workload=on_1, number=1, nodes=["node001"])
    ingest_node_kernel_logs(cluster, LocalTransport())

    with (tmp_path / "node002" / "kern.log").open("a") as log:
        log.write(
            "[87474.8] NVRM: Xid (PCI:0000:3b:00): 79, pid=2231, GPU has fallen off the bus.\n"
        )
    summary = ingest_node_kernel_logs(cluster, LocalTransport())
    assert summary.anomalies_new == 1
    anomaly = Anomaly.objects.get()
    assert anomaly.workload == on_2
    assert anomaly.implicated_nodes == ["node002"]
    assert Node.objects.get(name="node002").health == NodeHealth.UNHEALTHY
    assert Node.objects.get(name="node001").health == NodeHealth.UNKNOWN
    assert ingest_node_kernel_logs(cluster, LocalTransport()).anomalies_new == 0


def test_output_read_before_a_requeued_job_starts_again_belongs_to_the_old_attempt(
    workload: Workload,
) -> None:
    Attempt.objects.create(workload=workload, number=2)  # requeued, not started yet
    Workload.objects.filter(pk=workload.pk).update(current_attempt=2)
    workload.refresh_from_db()
    write(workload, XID)
    ingest_workload_logs(workload, LocalTransport())
    attempt = Anomaly.objects.get().attempt
    assert attempt is not None and attempt.number == 1


def test_a_node_failure_read_after_slurm_restarted_the_job_is_the_old_attempts(
    workload: Workload,
) -> None:
    """Found by the chaos run: polls delayed by killed workers read srun's node-failure lines
    only once Slurm's own requeue had started the job again on a new allocation that kept one
    of the old nodes (the batch host). The lines were filed under the new, healthy attempt and
    a restart of it was recommended and carried out."""
    now = timezone.now()
    Attempt.objects.filter(workload=workload, number=1).update(
        nodes=["gpu-0003", "gpu-0004", "gpu-0005"], started_at=now, ended_at=now
    )
    Attempt.objects.create(
        workload=workload, number=2, nodes=["gpu-0003", "gpu-0005", "gpu-0008"], started_at=now
    )
    Workload.objects.filter(pk=workload.pk).update(current_attempt=2)
    workload.refresh_from_db()
    write(
        workload,
        "srun: error: Node failure on gpu-0004\n"
        "slurmstepd-gpu-0003: error: *** JOB 1002 ON gpu-0003 CANCELLED AT 2026-12-02T06:45:50 "
        "DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***\n",
    )
    ingest_workload_logs(workload, LocalTransport())
    anomaly = Anomaly.objects.get()
    assert anomaly.attempt is not None and anomaly.attempt.number == 1
    assert not Recommendation.objects.filter(attempt__number=2).exists()


def test_a_notice_printed_before_the_restart_started_is_the_old_attempts(
    workload: Workload,
) -> None:
    """Found by the chaos run: a preemption notice read late, after Slurm
    had requeued and started the job again, was filed under the new attempt and marked survived
    by the new attempt's progress. Its place in the output, after the old attempt's timed
    progress lines and before the new attempt's, says whose it is."""
    start = timezone.now().replace(microsecond=0)
    restarted = start + timedelta(seconds=40)
    Attempt.objects.filter(workload=workload, number=1).update(
        nodes=["gpu-0001", "gpu-0002"], started_at=start, ended_at=restarted
    )
    Attempt.objects.create(
        workload=workload, number=2, nodes=["gpu-0001", "gpu-0002"], started_at=restarted
    )
    Workload.objects.filter(pk=workload.pk).update(current_attempt=2)
    workload.refresh_from_db()

    def progress(at: datetime, step: int) -> str:
        return f"[{at.isoformat()}] iteration {step:8d}/     900 | lm loss: 2.5 |\n"

    write(
        workload,
        progress(start + timedelta(seconds=30), 10)
        + "slurmstepd: error: *** JOB 1001 ON gpu-0001 CANCELLED AT "
        f"{(start + timedelta(seconds=35)).replace(tzinfo=None).isoformat()} "
        "DUE TO PREEMPTION ***\n"
        + progress(restarted + timedelta(seconds=5), 11)
        + progress(restarted + timedelta(seconds=9), 12),
    )
    ingest_workload_logs(workload, LocalTransport())
    anomaly = Anomaly.objects.get()
    assert anomaly.attempt is not None and anomaly.attempt.number == 1


def test_a_crash_printed_after_the_restart_started_is_the_new_attempts(
    workload: Workload,
) -> None:
    start = timezone.now().replace(microsecond=0) - timedelta(minutes=5)
    restarted = start + timedelta(seconds=40)
    Attempt.objects.filter(workload=workload, number=1).update(
        nodes=["gpu-0001"], started_at=start, ended_at=restarted
    )
    Attempt.objects.create(workload=workload, number=2, nodes=["gpu-0001"], started_at=restarted)
    Workload.objects.filter(pk=workload.pk).update(current_attempt=2)
    workload.refresh_from_db()
    at = (restarted + timedelta(seconds=5)).isoformat()
    write(workload, f"[{at}] iteration        3/     900 | lm loss: 2.5 |\n" + XID)
    ingest_workload_logs(workload, LocalTransport())
    anomaly = Anomaly.objects.get()
    assert anomaly.attempt is not None and anomaly.attempt.number == 2


def unseen_attempts_before(workload: Workload, current: int, **current_fields: object) -> None:
    """As the poll leaves a job Slurm requeued while nobody looked: the attempts before
    ``current`` not seen running have rows without nodes or start."""
    Attempt.objects.filter(workload=workload, number=1).update(
        exit_state="requeued", ended_at=timezone.now()
    )
    for number in range(2, current):
        Attempt.objects.create(workload=workload, number=number, exit_state="requeued")
    Attempt.objects.create(workload=workload, number=current, **current_fields)
    Workload.objects.filter(pk=workload.pk).update(current_attempt=current)
    workload.refresh_from_db()


def test_a_node_failure_of_an_attempt_never_seen_running_is_not_the_current_attempts(
    workload: Workload,
) -> None:
    """Found by the chaos run: a job first polled after Slurm had requeued it for a dead node
    (workers were down) had the dead node's srun line read with its second attempt's output.
    With no row for the first attempt, it was filed under the second, healthy one; the
    restart recommended for it was approved and carried out on a job that was training."""
    unseen_attempts_before(workload, 2, nodes=["gpu-0001", "gpu-0002"], started_at=timezone.now())
    write(workload, "srun: error: Node failure on gpu-0022\n" + PROGRESS.format(step=3))
    ingest_workload_logs(workload, LocalTransport())
    anomaly = Anomaly.objects.get()
    assert anomaly.attempt is not None and anomaly.attempt.number == 1
    assert anomaly.implicated_nodes == ["gpu-0022"]
    assert not Recommendation.objects.filter(attempt__number=2).exists()


def test_evidence_printed_before_the_current_start_goes_to_the_attempt_never_seen(
    workload: Workload,
) -> None:
    start = timezone.now().replace(microsecond=0) - timedelta(minutes=5)
    restarted = start + timedelta(seconds=60)
    Attempt.objects.filter(workload=workload, number=1).update(nodes=["gpu-0001"], started_at=start)
    unseen_attempts_before(workload, 3, nodes=["gpu-0001"], started_at=restarted)
    at = (restarted - timedelta(seconds=20)).isoformat()
    write(
        workload,
        f"[{at}] iteration        3/     900 | lm loss: 2.5 |\n"
        "slurmstepd: error: *** JOB 1001 ON gpu-0001 CANCELLED AT "
        f"{(restarted - timedelta(seconds=15)).replace(tzinfo=None).isoformat()} "
        "DUE TO PREEMPTION ***\n",
    )
    ingest_workload_logs(workload, LocalTransport())
    anomaly = Anomaly.objects.get()
    assert anomaly.attempt is not None and anomaly.attempt.number == 2


def test_a_node_the_last_attempt_seen_had_is_its_own_across_an_unseen_attempt(
    workload: Workload,
) -> None:
    now = timezone.now()
    Attempt.objects.filter(workload=workload, number=1).update(
        nodes=["gpu-0001", "gpu-0002"], started_at=now - timedelta(minutes=5)
    )
    unseen_attempts_before(workload, 3, nodes=["gpu-0007", "gpu-0008"], started_at=now)
    write(workload, "srun: error: Node failure on gpu-0002\n")
    ingest_workload_logs(workload, LocalTransport())
    first = Anomaly.objects.get()
    assert first.attempt is not None and first.attempt.number == 1


def test_a_clock_before_the_submission_says_nothing_about_an_unseen_attempt(
    workload: Workload,
) -> None:
    restarted = timezone.now().replace(microsecond=0)
    unseen_attempts_before(workload, 2, nodes=["gpu-0001"], started_at=restarted)
    long_before = (workload.submit_time - timedelta(days=3)).isoformat()
    write(
        workload,
        f"[{long_before}] iteration        3/     900 | lm loss: 2.5 |\n"
        "RuntimeError: CUDA error: an illegal memory access was encountered\n",
    )
    ingest_workload_logs(workload, LocalTransport())
    anomaly = Anomaly.objects.get()
    assert anomaly.attempt is not None and anomaly.attempt.number == 2


def test_a_notice_read_alone_after_the_restart_is_the_old_attempts_by_its_own_time(
    workload: Workload,
) -> None:
    """Found by the short chaos run: Slurm preempted and requeued the job, the next read began
    with the preemption notice and no timed line before it; the notice's own "CANCELLED AT"
    time was not read, so it was filed under the new attempt and marked survived."""
    start = timezone.now().replace(microsecond=0) - timedelta(minutes=5)
    restarted = start + timedelta(seconds=40)
    Attempt.objects.filter(workload=workload, number=1).update(
        nodes=["gpu-0014", "gpu-0015"], started_at=start, ended_at=restarted
    )
    Attempt.objects.create(
        workload=workload, number=2, nodes=["gpu-0012", "gpu-0014"], started_at=restarted
    )
    Workload.objects.filter(pk=workload.pk).update(current_attempt=2)
    workload.refresh_from_db()
    cancelled = (restarted - timedelta(seconds=3)).replace(tzinfo=None).isoformat()
    write(
        workload,
        f"slurmstepd: error: *** JOB 1005 ON gpu-0014 CANCELLED AT {cancelled} "
        "DUE TO PREEMPTION ***\n",
    )
    ingest_workload_logs(workload, LocalTransport())
    anomaly = Anomaly.objects.get()
    assert anomaly.attempt is not None and anomaly.attempt.number == 1


NAN_STEP = " iteration {step:8d}/     100 | lm loss: NaN | loss scale: 4096.0 | grad norm: nan |\n"


def failures_of(workload: Workload) -> list[tuple[str, str]]:
    return list(
        Anomaly.objects.filter(workload=workload)
        .exclude(severity="warning")
        .values_list("category", "signature")
    )


def test_a_loss_that_stays_nan_across_polls_is_a_divergence(workload: Workload) -> None:
    write(workload, PROGRESS.format(step=1) + NAN_STEP.format(step=2))
    ingest_workload_logs(workload, LocalTransport())
    assert failures_of(workload) == []
    assert LogCursor.objects.get().nonfinite_streaks[""][0] == 1
    write(workload, NAN_STEP.format(step=3))
    ingest_workload_logs(workload, LocalTransport())
    assert failures_of(workload) == [("nan_divergence", "nonfinite-progress-value")]


def test_the_policy_sets_how_many_nan_steps_make_a_divergence(workload: Workload) -> None:
    from recovery.models import Policy

    Policy.objects.create(name="patient", nonfinite_steps=3)
    for step in (2, 3):
        write(workload, NAN_STEP.format(step=step))
        ingest_workload_logs(workload, LocalTransport())
    assert failures_of(workload) == []
    write(workload, NAN_STEP.format(step=4))
    ingest_workload_logs(workload, LocalTransport())
    assert failures_of(workload) == [("nan_divergence", "nonfinite-progress-value")]


def test_a_nan_run_is_a_divergence_the_policy_decides_with_an_operator(
    workload: Workload,
) -> None:
    from recovery.choices import AnomalyKind, ClusterMode, RecommendationStatus
    from recovery.models import Policy

    Policy.objects.create(name="stop diverged", divergence_action="stop")
    workload.cluster.mode = ClusterMode.ACTION
    workload.cluster.save()
    write(workload, PROGRESS.format(step=1) + NAN_STEP.format(step=2) + NAN_STEP.format(step=3))
    ingest_workload_logs(workload, LocalTransport())
    divergence = Anomaly.objects.exclude(severity="warning").get()
    assert divergence.kind == AnomalyKind.DIVERGENCE
    assert divergence.details["since_step"] == 2
    stop = Recommendation.objects.get()
    assert (stop.action, stop.status) == ("stop", RecommendationStatus.AWAITING_APPROVAL)


def test_a_pushed_peer_reported_failure_names_no_node(workload: Workload) -> None:
    from recovery.loop.push import LogBatch, ingest_log_batch

    line = (
        "include/socket.h:390 NCCL WARN Connect to 10.38.10.112<21724> failed : Connection refused"
    )
    ingest_log_batch(workload, LogBatch(lines=[line], node="node002", rank=3))
    anomaly = Anomaly.objects.get()
    assert anomaly.category == "interconnect"
    assert anomaly.implicated_nodes == [] and anomaly.implicated_ranks == []
    assert anomaly.details["reported_by_nodes"] == ["node002"]
