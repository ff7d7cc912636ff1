"""What jobs and scheduler hooks push through the ingestion API, fed into the polling paths.

A job may push progress and checkpoint heartbeats and batches of its log lines; they go through
the same code as lines read from its output file (``recovery.loop.logs``, then
``recovery.loop.anomalies``): the same detectors, the same anomalies, progress samples and
``checkpoint_saved`` / ``progress_resumed`` events.

A scheduler hook (Slurm's EpilogSlurmctld, a strigger program) may say that a job ended or a node
went down. That is not evidence by itself: it is recorded, and it asks for an immediate poll of
the cluster, which reads the scheduler's own state. The scheduler stays the source of truth, so a
late, repeated or wrong hook changes nothing a poll would not. The caller passes in how a poll
is queued (``tasks.polling.queue_poll``): the domain knows no task.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from recovery.audit.record import record_event
from recovery.choices import AuditKind, EvidenceSource
from recovery.detection.scanner import CheckpointPoint, ProgressPoint, ScanResult
from recovery.loop.anomalies import attempt_writing, record_progress, record_read
from recovery.loop.logs import scan
from recovery.loop.poll import is_polled
from recovery.models import AuditEvent, Cluster, LogCursor, Node, Workload

logger = logging.getLogger(__name__)

# Caps on one request. A job that logs more sends more batches; its output file is still read.
MAX_HEARTBEATS = 1000
MAX_LOG_LINES = 5000
MAX_LOG_BYTES = 1024 * 1024
MAX_LINE_CHARS = 8 * 1024
TRUNCATED_MARK = " …[truncated]"

# A pushed scheduler event is recorded but not used as evidence: the poll it triggers records
# what the scheduler says.
HOOK_EVENT_KIND = AuditKind.SCHEDULER_HOOK
HOOK_SOURCE = "scheduler_hook"
# A node-down hook repeated within this window (strigger re-arming, a flapping node) is one record.
NODE_DOWN_REPEAT_WINDOW = timedelta(minutes=10)
# Polls asked for by hooks are spread out: a thousand jobs ending together ask for one poll.
POLL_DEBOUNCE_MS = 1000
PUSHED_STREAM_PREFIX = "push:"

# Queues one poll of the cluster with this primary key; raises when it cannot.
QueuePoll = Callable[[int], object]


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
    workload: Workload, batch: LogBatch, *, now: datetime | None = None
) -> LogBatchSummary:
    """Feed pushed log lines to the detectors, as lines read from the job's output file are."""
    now = now or timezone.now()
    lines, truncated = clean_lines(batch.lines)
    summary = LogBatchSummary(lines=len(lines), truncated_lines=truncated)
    with transaction.atomic():
        locked = Workload.objects.select_for_update().select_related("cluster").get(pk=workload.pk)
        if batch.sequence is not None:
            stream = batch.stream or default_stream(batch.node, batch.rank)
            cursor, _ = LogCursor.objects.select_for_update().get_or_create(
                workload=locked, path=(PUSHED_STREAM_PREFIX + stream)[:1024]
            )
            if batch.sequence <= cursor.offset:
                return LogBatchSummary(duplicate=True)
            cursor.offset = batch.sequence
            cursor.save(update_fields=["offset", "updated_at"])
        if not lines:
            return summary
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


# --- scheduler hooks ----------------------------------------------------------------------


@dataclass(frozen=True)
class JobEnded:
    job_id: str
    state: str = ""
    exit_code: int | None = None
    exit_code_text: str = ""
    nodes: list[str] = field(default_factory=list)
    restart_count: int | None = None


@dataclass(frozen=True)
class NodeDown:
    node: str
    state: str = ""
    reason: str = ""


class HookStatus(StrEnum):
    """What became of a pushed scheduler event; the hook endpoints answer with the value."""

    # Written to the audit trail now.
    RECORDED = "recorded"
    # The same event was recorded before.
    DUPLICATE = "duplicate"
    # Nothing to record (the reason says why).
    IGNORED = "ignored"


@dataclass(frozen=True)
class HookOutcome:
    """What became of a pushed scheduler event, and why.

    In every case but a job that is not opted in, a poll of the cluster is asked for.
    """

    status: HookStatus
    reason: str
    poll_requested: bool
    workload: Workload | None = None
    event: AuditEvent | None = None


def record_job_ended(
    cluster: Cluster, ended: JobEnded, *, actor: str, queue_poll: QueuePoll
) -> HookOutcome:
    workload = find_workload(cluster, ended.job_id)
    if workload is None:
        # Perhaps a job too short for any poll to have seen: the poll will find it if it is ours.
        poll = request_poll(cluster, queue_poll)
        return HookOutcome(
            HookStatus.IGNORED, f"job {ended.job_id} is not known on cluster {cluster.name}", poll
        )
    if not workload.opted_in:
        return HookOutcome(
            HookStatus.IGNORED, f"job {ended.job_id} is not opted in to recovery", False, workload
        )
    key = f"job_ended:{ended.job_id}:{ended.restart_count}:{ended.state}:{ended.exit_code}"
    payload: dict[str, Any] = {
        "source": HOOK_SOURCE,
        "event": "job_ended",
        "key": key,
        "job_id": ended.job_id,
        "state": ended.state,
        "exit_code": ended.exit_code,
        "exit_code_text": ended.exit_code_text,
        "nodes": ended.nodes[:256],
        "restart_count": ended.restart_count,
        "note": "recorded only; the poll it triggers reads the job's state from the scheduler",
    }
    with transaction.atomic():
        Workload.objects.select_for_update().filter(pk=workload.pk).first()
        seen = AuditEvent.objects.filter(workload=workload, kind=HOOK_EVENT_KIND, payload__key=key)
        if seen.exists():
            return HookOutcome(
                HookStatus.DUPLICATE,
                "this job end was recorded before",
                request_poll(cluster, queue_poll),
                workload,
            )
        event = record_event(
            cluster=cluster,
            workload=workload,
            attempt=workload.current_attempt or None,
            kind=HOOK_EVENT_KIND,
            actor=actor,
            payload=payload,
        )
        poll = request_poll(cluster, queue_poll)
    return HookOutcome(HookStatus.RECORDED, "job end recorded", poll, workload, event)


def record_node_down(
    cluster: Cluster, down: NodeDown, *, actor: str, queue_poll: QueuePoll
) -> HookOutcome:
    node = Node.objects.filter(cluster=cluster, name=down.node).first()
    if node is None:
        return HookOutcome(
            HookStatus.IGNORED,
            f"node {down.node} is not known on cluster {cluster.name}",
            request_poll(cluster, queue_poll),
        )
    key = f"node_down:{down.node}:{down.state}:{down.reason}"[:512]
    with transaction.atomic():
        Cluster.objects.select_for_update().filter(pk=cluster.pk).first()
        recent = AuditEvent.objects.filter(
            cluster=cluster,
            kind=HOOK_EVENT_KIND,
            payload__key=key,
            occurred_at__gte=timezone.now() - NODE_DOWN_REPEAT_WINDOW,
        )
        if recent.exists():
            return HookOutcome(
                HookStatus.DUPLICATE,
                "this node state was recorded lately",
                request_poll(cluster, queue_poll),
            )
        event = record_event(
            cluster=cluster,
            kind=HOOK_EVENT_KIND,
            actor=actor,
            payload={
                "source": HOOK_SOURCE,
                "event": "node_down",
                "key": key,
                "node": down.node,
                "state": down.state,
                "reason": down.reason,
                "note": "recorded only; the poll it triggers reads the node's state from the "
                "scheduler",
            },
        )
        poll = request_poll(cluster, queue_poll)
    return HookOutcome(HookStatus.RECORDED, "node state recorded", poll, event=event)


def request_poll(cluster: Cluster, queue_poll: QueuePoll) -> bool:
    """Ask for a poll of the cluster once the current transaction commits.

    Returns whether one was asked for: only clusters with a scheduler behind them are polled.
    """
    if not is_polled(cluster):
        return False
    cluster_id = cluster.pk
    transaction.on_commit(lambda: enqueue_poll(cluster_id, queue_poll))
    return True


def enqueue_poll(cluster_id: int, queue_poll: QueuePoll) -> bool:
    """Queue a poll with ``queue_poll`` unless a hook queued one within POLL_DEBOUNCE_MS.

    Never raises: a hook must not fail because the broker is away; the beat polls anyway.
    """
    import redis

    try:
        first = redis.Redis.from_url(settings.REDIS_URL).set(
            f"wr:hook-poll:{cluster_id}", 1, nx=True, px=POLL_DEBOUNCE_MS
        )
        if not first:
            return False
        queue_poll(cluster_id)
    except Exception:
        logger.warning("could not queue a poll of cluster %s for a hook", cluster_id, exc_info=True)
        return False
    return True
