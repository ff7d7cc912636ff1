"""A read's progress and checkpoints, recorded before its findings (``recovery.loop.anomalies``).

What the job's own lines say about how far it got: its last step, the progress samples the hang
and straggler checks read, its quiet phases (a checkpoint save, an evaluation pass) and the
checkpoints it finished. None of it is an anomaly; it is what tells a crash the job survived
from its last words, so ``record_read`` stores it first. The batched read of a shard of
workloads (``recovery.loop.workload_outputs``) writes the same fields with the same helpers.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from recovery.audit.actors import Actor
from recovery.audit.record import record_event, record_events
from recovery.choices import AuditKind
from recovery.detection.quiet_phases import CHECKPOINT, EVALUATION
from recovery.detection.scanner.results import ScanResult
from recovery.models import Attempt, AuditEvent, ProgressSample, Workload

# Progress samples older than this are dropped: the longest window a detector reads.
SAMPLE_RETENTION = timedelta(hours=2)


def record_progress(
    workload: Workload, attempt: Attempt | None, result: ScanResult, now: datetime
) -> int:
    number = attempt.number if attempt else None
    if number:
        record_progress_samples(workload, number, result, now)
    resumed = bool(
        result.progress
        and number
        and number > 1
        and not _has_event(workload, number, AuditKind.PROGRESS_RESUMED)
    )
    note_quiet_phases(workload, result, now, continues_attempt=not resumed)
    if result.progress:
        latest = result.progress[-1]
        if resumed:
            first = result.progress[0]
            record_event(
                cluster=workload.cluster,
                workload=workload,
                attempt=number,
                kind=AuditKind.PROGRESS_RESUMED,
                actor=Actor.DETECTOR,
                payload={"step": first.step},
                occurred_at=first.at or now,
            )
        workload.last_progress_step = latest.step
        workload.last_progress_at = latest.at or now
    saved = len(record_events(checkpoint_events(workload, number, result, now)))
    if saved and attempt is not None and not attempt.produced_checkpoint:
        attempt.produced_checkpoint = True
        attempt.save(update_fields=["produced_checkpoint"])
    workload.save(update_fields=PROGRESS_FIELDS)
    return saved


# What a read of a job's output changes on its workload.
PROGRESS_FIELDS = [
    "last_progress_step",
    "last_progress_at",
    "last_checkpoint_step",
    "last_checkpoint_at",
    "longest_quiet_seconds",
    "quiet_phase",
    "quiet_phase_at",
    "updated_at",
]


def note_quiet_phases(
    workload: Workload, result: ScanResult, now: datetime, *, continues_attempt: bool
) -> None:
    """Keep what the read shows of the job's quiet phases on ``workload`` (not saved).

    The longest time between two changes of step, within one attempt (the gap across a
    restart is downtime, not a phase of the job), and a checkpoint save or evaluation pass
    announced after the read's last step, which the next step ends.
    """
    times = [
        (point.at or now, point.step)
        for point in sorted(result.progress, key=lambda p: (p.at or now, p.line))
    ]
    previous = None
    if continues_attempt and workload.last_progress_at is not None:
        previous = (workload.last_progress_at, workload.last_progress_step)
    longest = workload.longest_quiet_seconds or 0.0
    for at, step in times:
        if previous is not None and step != previous[1]:
            longest = max(longest, (at - previous[0]).total_seconds())
        if previous is None or step != previous[1]:
            previous = (at, step)
    if longest > 0:
        workload.longest_quiet_seconds = longest
    last_step_line = max((point.line for point in result.progress), default=0)
    announced = [
        (checkpoint.line, CHECKPOINT, checkpoint.at)
        for checkpoint in result.checkpoints
        if not checkpoint.completed
    ] + [(evaluation.line, EVALUATION, evaluation.at) for evaluation in result.evaluations]
    saved_line = max((c.line for c in result.checkpoints if c.completed), default=0)
    phase = max(announced, default=None, key=lambda item: item[0])
    if (
        phase is not None
        and phase[0] > last_step_line
        and not (phase[1] == CHECKPOINT and saved_line > phase[0])
    ):
        workload.quiet_phase, workload.quiet_phase_at = phase[1], phase[2] or now
    elif result.progress or saved_line:
        workload.quiet_phase, workload.quiet_phase_at = "", None


def checkpoint_events(
    workload: Workload, attempt: int | None, result: ScanResult, now: datetime
) -> list[AuditEvent]:
    """The read's finished checkpoints newer than the workload's last, as unsaved
    ``checkpoint_saved`` events; the workload's last checkpoint moves to the newest."""
    events = []
    for checkpoint in result.checkpoints:
        if not checkpoint.completed:
            continue
        step = checkpoint.step
        last = workload.last_checkpoint_step
        if step is not None and last is not None and step <= last:
            continue  # already recorded (or an older one seen again)
        workload.last_checkpoint_step = step
        workload.last_checkpoint_at = checkpoint.at or now
        events.append(
            AuditEvent(
                cluster=workload.cluster,
                workload=workload,
                attempt=attempt,
                kind=AuditKind.CHECKPOINT_SAVED,
                actor=Actor.DETECTOR,
                payload={"step": step, "path": checkpoint.path},
                occurred_at=checkpoint.at or now,
            )
        )
    return events


def finite_or_none(value: float | None) -> float | None:
    """A number the database can store: MySQL has no NaN or infinity."""
    return value if value is not None and math.isfinite(value) else None


def record_progress_samples(
    workload: Workload, attempt: int, result: ScanResult, now: datetime
) -> int:
    """Keep the read's progress points (per rank and node) for the hang and straggler checks."""
    samples = [
        ProgressSample(
            workload=workload,
            attempt=attempt,
            rank=point.rank,
            node=(point.node or "")[:128],
            step=point.step,
            loss=finite_or_none(point.loss),
            throughput=point.throughput,
            step_time_seconds=point.step_time_seconds,
            at=point.at or now,
        )
        for point in result.progress
    ]
    if samples:
        ProgressSample.objects.bulk_create(samples)
        ProgressSample.objects.filter(workload=workload, at__lt=now - SAMPLE_RETENTION).delete()
    return len(samples)


def _has_event(workload: Workload, attempt: int, kind: str) -> bool:
    return AuditEvent.objects.filter(workload=workload, attempt=attempt, kind=kind).exists()
