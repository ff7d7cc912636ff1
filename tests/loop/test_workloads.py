"""The per-workload half of a poll: bulk reads, endings judged once, shards kept apart."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from recovery.choices import AttemptExitState, AuditKind
from recovery.loop import workload_outputs
from recovery.loop import workloads as workload_work
from recovery.loop.evidence_attempts import attempt_writing_of
from recovery.loop.logs import output_access
from recovery.loop.monitors import SchedulerEnding
from recovery.loop.patterns import active_signature_set
from recovery.loop.workloads import process_workloads
from recovery.models import (
    Anomaly,
    Attempt,
    AuditEvent,
    Cluster,
    LogCursor,
    Policy,
    ProgressSample,
    Workload,
)
from recovery.schedulers.phase import Phase
from recovery.schedulers.transport import LocalTransport
from tests.factories import ClusterFactory, WorkloadFactory

pytestmark = pytest.mark.django_db

# Minutes ago: older samples are past their retention and dropped as they are written.
NOW = timezone.now().replace(microsecond=0) - timedelta(minutes=5)
STAMP = NOW.strftime("%Y-%m-%dT%H:%M")
PROGRESS = "0: " + STAMP + ":{second:02d}Z gpu-001: step: {step} loss: 2.5 tps: 4,800 mfu: 40%\n"
SAVED = (
    "0: " + STAMP + ":30Z gpu-001: successfully saved checkpoint from iteration {step} to /ckpt\n"
)
XID = "gpu-001 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n"


def running_workload(tmp_path: Path, name: str, cluster: Cluster | None = None) -> Workload:
    workload = WorkloadFactory(
        cluster=cluster or Cluster.objects.first() or ClusterFactory(),
        stdout_path=str(tmp_path / f"{name}.out"),
        work_dir=str(tmp_path),
        user_uid=os.getuid(),
        current_attempt=1,
        state="running",
        opted_in=True,
    )
    Attempt.objects.create(workload=workload, number=1, started_at=timezone.now())
    return workload


def write(workload: Workload, text: str) -> None:
    with Path(workload.stdout_path).open("a") as handle:
        handle.write(text)


def test_progress_of_many_workloads_is_written_in_a_few_statements(tmp_path: Path) -> None:
    """
    GIVEN forty running workloads, each with new progress lines in its output
    WHEN their shard is processed
    THEN every cursor, sample and last step is stored, with a number of queries that does not
         grow with the workloads; processed again with nothing new, nothing changes
    """
    batch = [running_workload(tmp_path, f"job{index}") for index in range(40)]
    for workload in batch:
        write(workload, "".join(PROGRESS.format(second=s, step=100 + s) for s in range(3)))
    cluster = batch[0].cluster
    ids = [w.pk for w in batch]
    # Their hang checks are not due (each is a few queries, every PROGRESS_CHECK_SECONDS).
    Workload.objects.update(progress_checked_at=timezone.now())
    with CaptureQueriesContext(connection) as queries:
        summary = process_workloads(cluster, ids, LocalTransport())
    assert summary.full_reads == 0
    assert ProgressSample.objects.count() == 40 * 3
    sample = ProgressSample.objects.filter(workload=batch[0]).latest("step")
    assert (sample.attempt, sample.rank, sample.node, sample.step) == (1, 0, "gpu-001", 102)
    assert sample.at.second == 2
    assert set(Workload.objects.values_list("last_progress_step", flat=True)) == {102}
    offsets = {c.path: c.offset for c in LogCursor.objects.all()}
    assert all(offsets[w.stdout_path] == Path(w.stdout_path).stat().st_size for w in batch)
    # Loading, cursors and the write transaction: not one query per workload.
    assert len(queries) <= 20, [q["sql"][:80] for q in queries.captured_queries]

    again = process_workloads(cluster, ids, LocalTransport())
    assert again.log_bytes == 0
    assert ProgressSample.objects.count() == 40 * 3


def test_a_checkpoint_in_a_plain_read_is_recorded_once(tmp_path: Path) -> None:
    workload = running_workload(tmp_path, "job")
    write(workload, PROGRESS.format(second=1, step=5) + SAVED.format(step=5))
    summary = process_workloads(workload.cluster, [workload.pk], LocalTransport())
    assert summary.full_reads == 0
    workload.refresh_from_db()
    assert workload.last_checkpoint_step == 5
    assert Attempt.objects.get().produced_checkpoint
    event = AuditEvent.objects.get(kind=AuditKind.CHECKPOINT_SAVED)
    assert (event.payload["step"], event.attempt) == (5, 1)

    write(workload, SAVED.format(step=5))  # the same checkpoint reported again
    process_workloads(workload.cluster, [workload.pk], LocalTransport())
    assert AuditEvent.objects.filter(kind=AuditKind.CHECKPOINT_SAVED).count() == 1


def test_quiet_phases_in_plain_reads_are_recorded(tmp_path: Path) -> None:
    """The stall rule judges silence by the job's own quiet phases: a job that never failed
    shows them in plain reads, so those must keep them too."""
    workload = running_workload(tmp_path, "job")
    write(workload, PROGRESS.format(second=1, step=5))
    process_workloads(workload.cluster, [workload.pk], LocalTransport())
    write(workload, PROGRESS.format(second=41, step=6) + SAVED.format(step=6))
    summary = process_workloads(workload.cluster, [workload.pk], LocalTransport())
    assert summary.full_reads == 0
    workload.refresh_from_db()
    assert workload.longest_quiet_seconds == pytest.approx(40.0)
    assert workload.last_progress_step == 6


def test_a_failure_takes_the_full_path_and_is_recorded_once(tmp_path: Path) -> None:
    workload = running_workload(tmp_path, "job")
    quiet = running_workload(tmp_path, "quiet")
    write(workload, PROGRESS.format(second=1, step=5) + XID)
    write(quiet, PROGRESS.format(second=1, step=7))
    summary = process_workloads(workload.cluster, [workload.pk, quiet.pk], LocalTransport())
    assert summary.full_reads == 1
    assert Anomaly.objects.get().category == "gpu_hardware"
    assert Workload.objects.get(pk=quiet.pk).last_progress_step == 7
    process_workloads(workload.cluster, [workload.pk, quiet.pk], LocalTransport())
    assert Anomaly.objects.count() == 1


def test_a_read_whose_cursor_moved_meanwhile_is_dropped(tmp_path: Path) -> None:
    """Another reader got there between this read and its write: its lines are not stored twice."""
    workload = running_workload(tmp_path, "job")
    write(workload, PROGRESS.format(second=1, step=5))
    batch = workload_outputs._load_batch([workload])
    cursors = workload_outputs._cursors([workload])
    cursor = cursors[(workload.pk, workload.stdout_path)]
    read = workload_outputs._read_file(
        workload,
        workload.stdout_path,
        LocalTransport().open_output(workload.stdout_path, output_access(workload)),
        cursor,
        active_signature_set(),
        workload_outputs.WorkloadsSummary(),
        batch.sizes,
    )
    assert read is not None
    read.attempt = attempt_writing_of(batch.attempts.get(workload.pk, []))
    LogCursor.objects.filter(pk=cursor.pk).update(offset=3)  # the other reader
    assert workload_outputs._record_plain([read], timezone.now()) == []
    assert ProgressSample.objects.count() == 0
    assert LogCursor.objects.get().offset == 3


def test_an_ending_is_judged_after_the_output_and_only_once(tmp_path: Path) -> None:
    workload = running_workload(tmp_path, "job")
    attempt = Attempt.objects.get()
    attempt.exit_state = AttemptExitState.NODE_FAIL
    attempt.ending_to_judge = SchedulerEnding(
        Phase.NODE_FAILED, "NODE_FAIL", exit_code=None, reason="NodeFail", end_time=timezone.now()
    ).to_json()
    attempt.save()
    first = process_workloads(workload.cluster, [workload.pk], LocalTransport())
    assert first.anomalies_new == 1
    assert Attempt.objects.get().ending_to_judge is None
    assert process_workloads(workload.cluster, [workload.pk], LocalTransport()).anomalies_new == 0
    assert Anomaly.objects.count() == 1


def test_hangs_are_checked_at_most_every_few_seconds(tmp_path: Path) -> None:
    workload = running_workload(tmp_path, "job")
    now = timezone.now()
    assert process_workloads(workload.cluster, [workload.pk], None, now).progress_checks == 1
    soon = now + timedelta(seconds=1)
    assert process_workloads(workload.cluster, [workload.pk], None, soon).progress_checks == 0
    later = now + timedelta(seconds=workload_work.PROGRESS_CHECK_SECONDS + 1)
    assert process_workloads(workload.cluster, [workload.pk], None, later).progress_checks == 1
    # A clock set back does not hold the checks off.
    earlier = now - timedelta(hours=1)
    assert process_workloads(workload.cluster, [workload.pk], None, earlier).progress_checks == 1


def test_a_short_straggler_window_is_checked_more_often(tmp_path: Path) -> None:
    workload = running_workload(tmp_path, "job")
    Policy.objects.create(name="short", straggler_window_minutes=1)
    now = timezone.now()
    assert process_workloads(workload.cluster, [workload.pk], None, now).progress_checks == 1
    later = now + timedelta(seconds=11)  # a sixth of the window, less than the usual 30 s
    assert process_workloads(workload.cluster, [workload.pk], None, later).progress_checks == 1


def test_a_silence_near_its_hang_timeout_is_checked_every_poll(tmp_path: Path) -> None:
    """A job that stopped printing is checked at every poll once its silence nears the
    policy's hang timeout (thirty minutes by default), so the hang is caught on time."""
    workload = running_workload(tmp_path, "job")
    now = timezone.now()
    workload.last_progress_at = now - timedelta(minutes=5)
    workload.progress_checked_at = now
    workload.save()
    soon = now + timedelta(seconds=1)
    assert process_workloads(workload.cluster, [workload.pk], None, soon).progress_checks == 0
    Workload.objects.filter(pk=workload.pk).update(
        last_progress_at=now - timedelta(minutes=29, seconds=50)
    )
    assert process_workloads(workload.cluster, [workload.pk], None, soon).progress_checks == 1
    again = soon + timedelta(seconds=2)
    assert process_workloads(workload.cluster, [workload.pk], None, again).progress_checks == 1


def test_a_workload_of_another_cluster_is_not_processed(tmp_path: Path) -> None:
    workload = running_workload(tmp_path, "job")
    other = running_workload(tmp_path, "other", ClusterFactory())
    write(other, PROGRESS.format(second=1, step=5))
    summary = process_workloads(workload.cluster, [other.pk], LocalTransport())
    assert summary.workloads == 0
    assert ProgressSample.objects.count() == 0


@pytest.mark.parametrize(
    ("kept", "phase"),
    [
        # Kept before phases existed: Slurm's word alone, read as Slurm's.
        ({"state": "NODE_FAIL", "exit_code": None}, Phase.NODE_FAILED),
        ({"state": "BOOT_FAIL"}, Phase.NODE_FAILED),
        ({"state": "SOMETHING_NEW"}, Phase.UNKNOWN),
        ({}, Phase.UNKNOWN),
        # Kept since: the phase the adapter gave, whatever the scheduler called it.
        ({"phase": "timed_out", "state": "Deadline"}, Phase.TIMED_OUT),
        ({"phase": "not-a-phase", "state": "FAILED"}, Phase.FAILED),
    ],
)
def test_an_ending_kept_on_an_attempt_is_read_back_with_its_phase(
    kept: dict[str, object], phase: Phase
) -> None:
    ending = SchedulerEnding.from_json(kept)
    assert ending.phase == phase
    assert ending.native_state == str(kept.get("state") or "")
    assert SchedulerEnding.from_json(ending.to_json()) == ending
