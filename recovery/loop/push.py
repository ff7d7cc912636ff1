"""What jobs push through the ingestion API, fed into the polling paths.

A job may push progress and checkpoint heartbeats and batches of its log lines; they go through
the same code as lines read from its output file (``recovery.loop.logs``, then
``recovery.loop.anomalies``): the same detectors, the same anomalies, progress samples and
``checkpoint_saved`` / ``progress_resumed`` events. What one job token may push for one job is
capped (``recovery.loop.push_budget``): streams of batches, heartbeats and log lines per
minute. A push past a cap is refused whole, and nothing of it is stored.

What scheduler hooks push is ``recovery.loop.scheduler_hooks``'s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from recovery.choices import EvidenceSource
from recovery.detection.scanner import CheckpointPoint, ProgressPoint, ScanResult
from recovery.loop.anomalies import record_read
from recovery.loop.evidence_attempts import attempt_writing
from recovery.loop.logs import scan
from recovery.loop.progress import record_progress
from recovery.loop.push_budget import PUSHED_STREAM_PREFIX, PushBudget, Spent
from recovery.models import Cluster, LogCursor, Workload

# Caps on one request. A job that logs more sends more batches; its output file is still read.
MAX_HEARTBEATS = 1000
MAX_LOG_LINES = 5000
MAX_LOG_BYTES = 1024 * 1024
MAX_LINE_CHARS = 8 * 1024
TRUNCATED_MARK = " …[truncated]"


def find_workload(cluster: Cluster, job_id: str) -> Workload | None:
    """The newest workload with this job id on this cluster (Slurm reuses ids after a reset)."""
    return (
        Workload.objects.filter(cluster=cluster, job_id=job_id)
        .order_by("-submit_time", "-id")
        .first()
    )


# --- heartbeats ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Heartbeat:
    step: int
    checkpoint_step: int | None = None
    rank: int | None = None
    node: str = ""
    throughput: float | None = None
    at: datetime | None = None


@dataclass
class HeartbeatSummary:
    samples: int = 0
    checkpoints: int = 0


def record_pushed_heartbeats(
    budget: PushBudget, by_job: list[tuple[Workload, list[Heartbeat]]]
) -> HeartbeatSummary:
    """Store one request's heartbeats, of one job or several, within the token's budget.

    Counted for every job first: past a job's cap (``PushRefused``) nothing of the request is
    stored, not even the heartbeats of the jobs within theirs.
    """
    total = HeartbeatSummary()
    with budget.taken((workload, Spent.HEARTBEATS, len(beats)) for workload, beats in by_job):
        for workload, beats in by_job:
            summary = record_heartbeats(workload, beats)
            total.samples += summary.samples
            total.checkpoints += summary.checkpoints
    return total


def record_heartbeats(
    workload: Workload, beats: Iterable[Heartbeat], *, now: datetime | None = None
) -> HeartbeatSummary:
    """Store pushed heartbeats as if their progress lines had been read from the output file.

    A checkpoint step at or below the last recorded one is not recorded again, so a retried
    request adds no ``checkpoint_saved`` event.
    """
    now = now or timezone.now()
    ordered = sorted(beats, key=lambda beat: (beat.at or now, beat.step))
    progress = [
        ProgressPoint(
            line=0,
            step=beat.step,
            rank=beat.rank,
            node=beat.node or None,
            at=beat.at or now,
            loss=None,
            throughput=beat.throughput,
            step_time_seconds=None,
        )
        for beat in ordered
    ]
    checkpoints = sorted(
        (
            CheckpointPoint(
                line=0, step=beat.checkpoint_step, path=None, at=beat.at or now, completed=True
            )
            for beat in ordered
            if beat.checkpoint_step is not None
        ),
        key=lambda point: point.step or 0,
    )
    result = ScanResult(
        findings=[],
        progress=progress,
        checkpoints=checkpoints,
        lines=len(progress),
        bytes=0,
        progress_lines=len(progress),
        checkpoint_lines=len(checkpoints),
        progress_after_last_failure=len(progress),
        engine="pushed",
    )
    with transaction.atomic():
        locked = Workload.objects.select_for_update().select_related("cluster").get(pk=workload.pk)
        attempt = attempt_writing(locked)
        saved = record_progress(locked, attempt, result, now)
    return HeartbeatSummary(samples=len(progress) if attempt else 0, checkpoints=saved)


# --- log batches --------------------------------------------------------------------------


@dataclass(frozen=True)
class LogBatch:
    lines: list[str]
    node: str = ""
    rank: int | None = None
    # Idempotency: within one stream, a batch whose sequence is not above the last one ingested
    # is a repeat (a retry after a lost answer) and is not ingested again.
    stream: str = ""
    sequence: int | None = None


@dataclass
class LogBatchSummary:
    duplicate: bool = False
    lines: int = 0
    truncated_lines: int = 0
    anomalies_new: int = 0
    checkpoints: int = 0


def clean_lines(text_or_lines: str | list[str]) -> tuple[list[str], int]:
    """Lines safe to store: no NULs or lone surrogates, each cut to MAX_LINE_CHARS.

    Returns the lines and how many were cut.
    """
    lines = text_or_lines.splitlines() if isinstance(text_or_lines, str) else list(text_or_lines)
    cleaned: list[str] = []
    cut = 0
    for line in lines:
        # A JSON string may hold a lone surrogate, which no database encoding can store.
        safe = line.encode("utf-8", "replace").decode("utf-8").replace("\x00", "\ufffd")
        safe = safe.rstrip("\r\n")
        if len(safe) > MAX_LINE_CHARS:
            safe = safe[:MAX_LINE_CHARS] + TRUNCATED_MARK
            cut += 1
        cleaned.append(safe)
    return cleaned, cut


def default_stream(node: str, rank: int | None) -> str:
    return f"{node or '-'}:{'-' if rank is None else rank}"


def ingest_log_batch(
    workload: Workload,
    batch: LogBatch,
    *,
    now: datetime | None = None,
    budget: PushBudget | None = None,
) -> LogBatchSummary:
    """Feed pushed log lines to the detectors, as lines read from the job's output file are.

    With ``budget``, a batch that would open a stream past the job's cap, or pass the token's
    lines per minute, raises ``PushRefused`` and leaves everything as it was (the stream's
    sequence too, so the batch sent again later is not taken for a repeat). A repeat spends
    nothing.
    """
    now = now or timezone.now()
    lines, truncated = clean_lines(batch.lines)
    summary = LogBatchSummary(lines=len(lines), truncated_lines=truncated)
    with transaction.atomic():
        locked = Workload.objects.select_for_update().select_related("cluster").get(pk=workload.pk)
        if batch.sequence is not None:
            stream = batch.stream or default_stream(batch.node, batch.rank)
            path = (PUSHED_STREAM_PREFIX + stream)[:1024]
            cursor = (
                LogCursor.objects.select_for_update().filter(workload=locked, path=path).first()
            )
            if cursor is None:
                if budget is not None:
                    budget.check_new_stream(locked, stream)
                cursor = LogCursor.objects.create(workload=locked, path=path)
            if batch.sequence <= cursor.offset:
                return LogBatchSummary(duplicate=True)
            cursor.offset = batch.sequence
            cursor.save(update_fields=["offset", "updated_at"])
        if not lines:
            return summary
        counted = (
            budget.taken([(locked, Spent.LOG_LINES, len(lines))])
            if budget is not None
            else nullcontext()
        )
        with counted:
            result = _attribute_to_sender(scan(("\n".join(lines) + "\n").encode()), batch)
            summary.anomalies_new, summary.checkpoints = record_read(
                locked, result, now, source=EvidenceSource.PUSHED
            )
    return summary


def _attribute_to_sender(result: ScanResult, batch: LogBatch) -> ScanResult:
    """Name the batch's node and rank where the lines themselves did not."""
    if not batch.node and batch.rank is None:
        return result
    for finding in result.findings:
        if batch.node and not finding.nodes:
            finding.name_node(batch.node)
        if batch.rank is not None and not finding.ranks:
            finding.name_rank(batch.rank)
    result.progress = [
        dataclasses.replace(
            point,
            node=point.node or batch.node or None,
            rank=point.rank if point.rank is not None else batch.rank,
        )
        for point in result.progress
    ]
    return result
