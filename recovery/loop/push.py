"""What jobs and scheduler hooks push through the ingestion API, fed into the polling paths.

A job may push progress and checkpoint heartbeats and batches of its log lines; they go through
the same code as lines read from its output file (``recovery.loop.logs``, then
``recovery.loop.anomalies``): the same detectors, the same anomalies, progress samples and
``checkpoint_saved`` / ``progress_resumed`` events. What one job token may push for one job is
capped (``PushBudget``): streams of batches, heartbeats and log lines per minute. A push past a
cap is refused whole, and nothing of it is stored.

A scheduler hook (Slurm's EpilogSlurmctld, a strigger program) may say that a job ended or a node
went down. That is not evidence by itself: it is recorded, and it asks for an immediate poll of
the cluster, which reads the scheduler's own state. The scheduler stays the source of truth, so a
late, repeated or wrong hook changes nothing a poll would not. The caller passes in how a poll
is queued (``tasks.polling.queue_poll``): the domain knows no task.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Any, cast

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from recovery.audit.record import record_event
from recovery.choices import AuditKind, EvidenceSource
from recovery.detection.scanner import CheckpointPoint, ProgressPoint, ScanResult
from recovery.loop.anomalies import attempt_writing, record_progress, record_read
from recovery.loop.logs import scan
from recovery.models import AuditEvent, Cluster, LogCursor, Node, Workload

if TYPE_CHECKING:
    import redis

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


# --- what one job token may push -----------------------------------------------------------


class PushRefused(Exception):
    """A push past a cap of its token: nothing of it was stored.

    ``retry_after`` is the seconds until the cap allows it again, or None when it never will
    as sent (more in one request than the cap allows in a minute).
    """

    def __init__(self, message: str, retry_after: int | None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class BudgetUnknown(Exception):
    """What the token has pushed this minute cannot be read (Redis does not answer): nothing is
    stored, as a push that is not counted could store without bound."""


class Spent(StrEnum):
    """What a job token's pushes for one job are counted in, per minute."""

    HEARTBEATS = "heartbeats"
    LOG_LINES = "log lines"


# Past the stream cap nothing resets; a client that waits this long before asking again asks
# once a minute.
STREAM_CAP_RETRY_SECONDS = 60
BUDGET_WINDOW_MS = 60_000
BUDGET_UNKNOWN_RETRY_SECONDS = 5
# Adds ``count`` to the minute's counter unless that passes ``limit``; the minute starts with
# the first push counted. Returns {1, total} when added, {0, milliseconds left} when not.
_TAKE = """
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
local count = tonumber(ARGV[1])
if used + count > tonumber(ARGV[2]) then
  return {0, redis.call('PTTL', KEYS[1])}
end
used = redis.call('INCRBY', KEYS[1], count)
if used == count then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return {1, used}
"""
# Gives ``count`` back when what it was taken for was not stored after all; a counter whose
# minute has ended is not brought back.
_GIVE_BACK = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  return redis.call('DECRBY', KEYS[1], ARGV[1])
end
return 0
"""


@functools.cache
def _budget_redis(url: str) -> redis.Redis:
    import redis

    # A Redis that does not answer must not hold a web process for long: the push is refused.
    return redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5)


@dataclass(frozen=True)
class PushBudget:
    """The caps one job token's pushes for one job are held to (settings ``JOB_TOKEN_*``).

    The per-minute counts live in Redis, where the API's request rates are counted, and are
    changed by one script each, so that concurrent requests on any number of web processes
    never pass a cap together. Streams are rows of the job, counted under its row lock.
    """

    token_id: int
    streams_per_job: int
    heartbeats_per_minute: int
    log_lines_per_minute: int

    @classmethod
    def of_token(cls, token_id: int) -> PushBudget:
        return cls(
            token_id=token_id,
            streams_per_job=settings.JOB_TOKEN_STREAMS_PER_JOB,
            heartbeats_per_minute=settings.JOB_TOKEN_HEARTBEATS_PER_MINUTE,
            log_lines_per_minute=settings.JOB_TOKEN_LOG_LINES_PER_MINUTE,
        )

    def limit(self, spent: Spent) -> int:
        if spent == Spent.HEARTBEATS:
            return self.heartbeats_per_minute
        return self.log_lines_per_minute

    def take(self, workload: Workload, spent: Spent, count: int) -> None:
        """Count ``count`` heartbeats or lines for the job, or raise ``PushRefused`` (nothing
        counted) when that would pass the minute's cap; ``BudgetUnknown`` when Redis does not
        answer."""
        if count <= 0:
            return
        limit = self.limit(spent)
        if count > limit:
            raise PushRefused(
                f"Too large: {count} {spent} in one request, and a job token may push at most "
                f"{limit} {spent} per minute for one job; send fewer per request.",
                None,
            )
        try:
            taken, value = self._run(_TAKE, workload, spent, count, limit, BUDGET_WINDOW_MS)
        except Exception as exc:  # a budget that cannot be read refuses the push (fail closed)
            raise BudgetUnknown(str(exc)) from exc
        if taken:
            return
        wait = max(1, math.ceil(value / 1000)) if value > 0 else BUDGET_WINDOW_MS // 1000
        raise PushRefused(
            f"This job token may push at most {limit} {spent} per minute for job "
            f"{workload.job_id}, and these {count} would pass that; none of them was stored. "
            f"Send them again in {wait} s.",
            wait,
        )

    def give_back(self, workload: Workload, spent: Spent, count: int) -> None:
        """Undo ``take`` for what was not stored after all; never raises."""
        if count <= 0:
            return
        try:
            self._run(_GIVE_BACK, workload, spent, count)
        except Exception:  # called while another error unwinds: that one must reach the caller
            logger.warning(
                "could not give back %s %s of job token %s",
                count, spent, self.token_id, exc_info=True,
            )  # fmt: skip

    @contextmanager
    def taken(self, spending: Iterable[tuple[Workload, Spent, int]]) -> Iterator[None]:
        """Take every part of ``spending`` or none, and give all back if the block fails."""
        done: list[tuple[Workload, Spent, int]] = []
        try:
            for workload, spent, count in spending:
                self.take(workload, spent, count)
                done.append((workload, spent, count))
            yield
        except BaseException:
            for workload, spent, count in done:
                self.give_back(workload, spent, count)
            raise

    def check_new_stream(self, workload: Workload, stream: str) -> None:
        """Refuse a stream past the job's cap. Called under the job's row lock, before the
        stream's row is created, so that concurrent batches cannot pass the cap together."""
        count = LogCursor.objects.filter(
            workload=workload, path__startswith=PUSHED_STREAM_PREFIX
        ).count()
        if count >= self.streams_per_job:
            raise PushRefused(
                f"Job {workload.job_id} has {count} streams of pushed batches, the most a job "
                f"may have; this batch would open another ({stream!r}) and was not stored. Send "
                "it on one of the job's streams, or without a sequence.",
                STREAM_CAP_RETRY_SECONDS,
            )

    def _run(self, script: str, workload: Workload, spent: Spent, *args: int) -> Any:
        # Where the API's request rates are counted, under the same prefix.
        throttle = cast("dict[str, Any]", settings.CACHES.get("throttle") or {})
        client = _budget_redis(str(throttle.get("LOCATION") or settings.REDIS_URL))
        prefix = throttle.get("KEY_PREFIX") or "wr"
        key = f"{prefix}:job-token-push:{self.token_id}:{workload.pk}:{spent.name.lower()}"
        return client.register_script(script)(keys=[key], args=list(args))


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
    if not cluster.is_polled:
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
    except Exception:  # a shortcut only: the next scheduled poll reads the job anyway
        logger.warning("could not queue a poll of cluster %s for a hook", cluster_id, exc_info=True)
        return False
    return True
