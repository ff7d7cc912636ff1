"""The output half of a shard's work (``recovery.loop.workloads``): each workload's new output
opened, read, scanned and recorded, for a batch of workloads at once.

The hot path is written in bulk. Most reads of a running job's output hold progress lines and
checkpoints and nothing else: their cursors, progress samples, checkpoint events and the
workloads' last progress and checkpoint are written with one statement each for the whole
batch, in one transaction, after every file was read and scanned. A read that found a failure,
or the first progress of a restart, takes the full path of
``recovery.loop.anomalies.record_read``, one workload at a time, as before. Either way a cursor
moves only in the transaction that records what was read, and only from the offset the read
started at, so a worker killed anywhere re-reads the same bytes and records nothing twice.

Apart from ``recovery.loop.workloads``, which runs these reads before the log store's, the
endings and the progress checks. ``WorkloadsSummary`` is here, with the reads that count most
of it, so that both modules fill it without importing each other.
"""

from __future__ import annotations

from contextlib import closing
from dataclasses import dataclass, field
from datetime import datetime

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from recovery.audit.record import record_events
from recovery.choices import AuditKind, EvidenceSource, Severity
from recovery.detection.scanner import ScanResult
from recovery.detection.signature_set import SignatureSet
from recovery.loop.anomalies import record_read
from recovery.loop.bulk import insert_values, update_rows
from recovery.loop.evidence_attempts import attempt_writing_of
from recovery.loop.logs import (
    MAX_READ_BYTES,
    IngestSummary,
    output_access,
    read_new_lines,
    record_refused_output,
    scan_output,
)
from recovery.loop.patterns import active_signature_set
from recovery.loop.progress import (
    PROGRESS_FIELDS,
    SAMPLE_RETENTION,
    checkpoint_events,
    finite_or_none,
    note_quiet_phases,
)
from recovery.models import Attempt, AuditEvent, LogCursor, ProgressSample, Workload
from recovery.schedulers.base import Transport
from recovery.schedulers.output_files import OutputAccess, OutputFile, OutputRefused

# What a read changes on its output's cursor.
CURSOR_FIELDS = ["offset", "truncations", "nonfinite_streaks", "updated_at"]
# Rows per INSERT of progress samples.
SAMPLES_PER_STATEMENT = 2000


@dataclass
class WorkloadsSummary:
    workloads: int = 0
    log_bytes: int = 0
    outputs_refused: int = 0
    anomalies_new: int = 0
    # Reads recorded one by one (a failure, a restart's first progress).
    full_reads: int = 0
    progress_checks: int = 0
    log_store_error: str = ""
    # Left alone on what this process remembers of them (``recovery.loop.held``).
    left_quiet: int = 0


@dataclass
class _Read:
    """One output file's new lines, scanned, before anything of it is written."""

    workload: Workload
    cursor: LogCursor
    started_at: tuple[int, int]  # the cursor's (offset, truncations) the read began from
    result: ScanResult
    attempt: Attempt | None


@dataclass
class _Batch:
    workloads: list[Workload]
    # Each workload's newest attempts, newest first (at most two: ``attempt_writing``).
    attempts: dict[int, list[Attempt]] = field(default_factory=dict)
    # (workload id, attempt number) that already recorded progress resumed.
    resumed: set[tuple[int, int | None]] = field(default_factory=set)
    # Each output's size when it was read to its end (None: it does not exist); an output
    # refused, or read only in part, has none.
    sizes: dict[tuple[int, str], int | None] = field(default_factory=dict)
    # Workloads whose read was not recorded (another reader moved the cursor meanwhile).
    unsettled: set[int] = field(default_factory=set)
    # When each workload checked is next due a check if nothing new is read.
    rechecks: dict[int, datetime | None] = field(default_factory=dict)


def _load_batch(workloads: list[Workload]) -> _Batch:
    batch = _Batch(workloads)
    newest = Q()
    for workload in workloads:
        newest |= Q(
            workload_id=workload.pk,
            number__lte=workload.current_attempt,
            number__gte=workload.current_attempt - 1,
        )
    for attempt in Attempt.objects.filter(newest).order_by("workload_id", "-number"):
        batch.attempts.setdefault(attempt.workload_id, []).append(attempt)
    restarted = [w.pk for w in workloads if w.current_attempt > 1]
    if restarted:
        batch.resumed = set(
            AuditEvent.objects.filter(
                workload_id__in=restarted, kind=AuditKind.PROGRESS_RESUMED
            ).values_list("workload_id", "attempt")
        )
    return batch


def _cursors(workloads: list[Workload]) -> dict[tuple[int, str], LogCursor]:
    """Every output file's cursor, created at offset 0 where a file has none yet."""
    wanted = {
        (workload.pk, path)
        for workload in workloads
        for path in (workload.stdout_path, workload.stderr_path)
        if path
    }
    ids = [w.pk for w in workloads]

    def stored() -> dict[tuple[int, str], LogCursor]:
        return {
            (cursor.workload_id, cursor.path): cursor
            for cursor in LogCursor.objects.filter(workload_id__in=ids)
            if (cursor.workload_id, cursor.path) in wanted
        }

    cursors = stored()
    missing = wanted - cursors.keys()
    if missing:
        # Offset 0 is where any reader would start: creating it twice is creating it once.
        LogCursor.objects.bulk_create(
            [LogCursor(workload_id=pk, path=path) for pk, path in missing], ignore_conflicts=True
        )
        cursors = stored()
    return cursors


def _read_outputs(
    batch: _Batch, transport: Transport, now: datetime, summary: WorkloadsSummary
) -> None:
    cursors = _cursors(batch.workloads)
    signatures = active_signature_set()
    files = [
        (workload, path, cursor)
        for workload in batch.workloads
        for path in dict.fromkeys(p for p in (workload.stdout_path, workload.stderr_path) if p)
        if (cursor := cursors.get((workload.pk, path))) is not None
    ]
    opened = _open_grown(files, transport, batch)
    plain: list[_Read] = []
    for workload, path, cursor in files:
        if (workload.pk, path) not in opened:
            continue
        output = opened[(workload.pk, path)]
        read = _read_file(workload, path, output, cursor, signatures, summary, batch.sizes)
        if read is None:
            continue
        read.attempt = attempt_writing_of(batch.attempts.get(workload.pk, []))
        if _needs_full_record(read, batch):
            if not _record_one(read, now, summary):
                batch.unsettled.add(workload.pk)
        else:
            plain.append(read)
    if plain:
        recorded = _record_plain(plain, now)
        batch.unsettled |= {read.workload.pk for read in plain if read not in recorded}


# Read ahead per file when files are opened in a batch: a poll's new output is usually a few
# lines; a longer one is read on from the file (one more round trip over SSH).
READ_AHEAD_BYTES = 64 * 1024

_Opened = OutputFile | OutputRefused | None


def _open_grown(
    files: list[tuple[Workload, str, LogCursor]], transport: Transport, batch: _Batch
) -> dict[tuple[int, str], _Opened]:
    """The files that grew (or shrank) since their cursor, opened in one batch per transport
    call: one stat of every file, then the opens, over SSH a few round trips for them all.

    A file whose size is its cursor's was read to its end: it is not opened, and its size is
    what ``recovery.loop.held`` remembers. A path two workloads name is opened once per
    workload, under each one's rules.
    """
    sizes = transport.output_sizes(list(dict.fromkeys(path for _, path, _ in files)))
    rounds: list[tuple[dict[str, int], dict[str, OutputAccess], dict[str, int]]] = []
    for workload, path, cursor in files:
        size = sizes.get(path)
        if size is not None and size == cursor.offset:
            batch.sizes[(workload.pk, path)] = size
            continue
        free = next((r for r in rounds if path not in r[0]), None)
        if free is None:
            free = ({}, {}, {})
            rounds.append(free)
        wanted, rules, owners = free
        wanted[path] = cursor.offset
        rules[path] = output_access(workload)
        owners[path] = workload.pk
    opened: dict[tuple[int, str], _Opened] = {}
    for wanted, rules, owners in rounds:
        for path, outcome in transport.open_outputs(wanted, rules, READ_AHEAD_BYTES).items():
            opened[(owners[path], path)] = outcome
    return opened


def _read_file(
    workload: Workload,
    path: str,
    output: _Opened,
    cursor: LogCursor,
    signatures: SignatureSet,
    summary: WorkloadsSummary,
    sizes: dict[tuple[int, str], int | None],
) -> _Read | None:
    """The new lines of one opened output, scanned; None when there are none, or it was
    refused. ``sizes`` gets the file's size when the read reached its end (None: missing)."""
    if isinstance(output, OutputRefused):
        summary.outputs_refused += 1
        record_refused_output(workload, path, output)
        return None
    if output is None:
        sizes[(workload.pk, path)] = None
        return None
    started_at = (cursor.offset, cursor.truncations)
    counted = IngestSummary()
    # From where the read starts (the start again when the file was cut short): read within
    # one limit, the read reaches the file's end and what it leaves is a line still unfinished.
    start = cursor.offset if output.size >= cursor.offset else 0
    with closing(output):
        consumed = read_new_lines(output.read, output.size, cursor, counted)
    if output.size - start <= MAX_READ_BYTES:
        sizes[(workload.pk, path)] = output.size
    if (cursor.offset, cursor.truncations) == started_at:
        return None
    summary.log_bytes += counted.bytes_read
    return _Read(
        workload, cursor, started_at, scan_output(workload, cursor, consumed, signatures), None
    )


def _needs_full_record(read: _Read, batch: _Batch) -> bool:
    """A read that is more than progress and checkpoints: findings, a restart resuming."""
    result = read.result
    if any(f.severity != Severity.WARNING for f in result.findings):
        return True
    attempt = read.attempt
    return bool(
        result.progress
        and attempt is not None
        and attempt.number > 1
        and (read.workload.pk, attempt.number) not in batch.resumed
    )


def _quiet(workload: Workload) -> tuple[object, ...]:
    return (workload.longest_quiet_seconds, workload.quiet_phase, workload.quiet_phase_at)


def _unmoved(reads: list[_Read]) -> list[_Read]:
    """The reads whose cursor no other reader moved since they began, their rows now locked
    (a read whose cursor moved is dropped: the next read starts where the other one left)."""
    locked = {
        pk: (offset, truncations)
        for pk, offset, truncations in LogCursor.objects.select_for_update()
        .filter(pk__in=[read.cursor.pk for read in reads])
        .values_list("pk", "offset", "truncations")
    }
    return [read for read in reads if locked.get(read.cursor.pk) == read.started_at]


def _record_one(read: _Read, now: datetime, summary: WorkloadsSummary) -> bool:
    """Record one read the full way; False when another reader moved its cursor meanwhile."""
    with transaction.atomic():
        if not _unmoved([read]):
            return False
        new, _ = record_read(read.workload, read.result, now, source=EvidenceSource.JOB_OUTPUT)
        read.cursor.save(update_fields=CURSOR_FIELDS)
    summary.full_reads += 1
    summary.anomalies_new += new
    return True


def _record_plain(reads: list[_Read], now: datetime) -> list[_Read]:
    """Reads of progress and checkpoints only: a few statements for all of them. Returns the
    reads recorded (not those whose cursor another reader moved meanwhile).

    What ``record_read`` records of such a read, in bulk: the cursors, the progress samples,
    each workload's last progress and checkpoint, a ``checkpoint_saved`` event per new
    checkpoint, and the attempts that produced one.
    """
    with transaction.atomic():
        reads = _unmoved(reads)
        if not reads:
            return reads
        stamp = timezone.now()
        for read in reads:
            read.cursor.updated_at = stamp
        update_rows(LogCursor, [read.cursor for read in reads], CURSOR_FIELDS)
        samples: list[tuple[object, ...]] = []
        progressed: dict[int, Workload] = {}
        events: list[AuditEvent] = []
        produced: set[int] = set()
        for read in reads:
            number = read.attempt.number if read.attempt is not None else None
            # Before the last progress moves: the gap from it is a quiet phase of the job.
            quiet_before = _quiet(read.workload)
            note_quiet_phases(read.workload, read.result, now, continues_attempt=True)
            if _quiet(read.workload) != quiet_before:
                progressed[read.workload.pk] = read.workload
            saved = checkpoint_events(read.workload, number, read.result, now)
            events += saved
            if saved:
                progressed[read.workload.pk] = read.workload
                if read.attempt is not None and not read.attempt.produced_checkpoint:
                    read.attempt.produced_checkpoint = True
                    produced.add(read.attempt.pk)
            if not read.result.progress:
                continue
            workload = read.workload
            if number is not None:
                samples += [
                    (
                        workload.pk,
                        number,
                        point.rank,
                        (point.node or "")[:128],
                        point.step,
                        finite_or_none(point.loss),
                        point.throughput,
                        point.step_time_seconds,
                        point.at or now,
                    )
                    for point in read.result.progress
                ]
            latest = read.result.progress[-1]
            workload.last_progress_step = latest.step
            workload.last_progress_at = latest.at or now
            progressed[workload.pk] = workload
        for start in range(0, len(samples), SAMPLES_PER_STATEMENT):
            insert_values(
                ProgressSample, SAMPLE_COLUMNS, samples[start : start + SAMPLES_PER_STATEMENT]
            )
        record_events(events)
        if produced:
            Attempt.objects.filter(pk__in=produced).update(produced_checkpoint=True)
        if progressed:
            # Locked, so that the update below cannot bring back a workload deleted meanwhile.
            alive = set(
                Workload.objects.select_for_update()
                .filter(pk__in=list(progressed))
                .values_list("pk", flat=True)
            )
            changed = [w for pk, w in progressed.items() if pk in alive]
            for workload in changed:
                workload.updated_at = stamp
            update_rows(Workload, changed, PROGRESS_FIELDS)
        if samples:
            ProgressSample.objects.filter(
                workload_id__in=list({sample[0] for sample in samples}),
                at__lt=now - SAMPLE_RETENTION,
            ).delete()
    return reads


SAMPLE_COLUMNS = [
    "workload",
    "attempt",
    "rank",
    "node",
    "step",
    "loss",
    "throughput",
    "step_time_seconds",
    "at",
]
