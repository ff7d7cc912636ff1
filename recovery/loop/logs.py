"""Reading job output files and node kernel logs from where the last read stopped.

Each read, its findings, its progress and the new offset are stored in one transaction, so a
worker killed mid-way re-reads the same bytes next time and records nothing twice. Only
complete lines are consumed; a partial last line waits for the next read. A file that became
shorter than the offset was truncated by a restart that does not append: it is read again
from the start as the new attempt's output.

What a read finds is recorded by ``recovery.loop.anomalies`` (``record_read``,
``record_findings``), the same step that pushed lines and log stores go through.

A job chooses its own output paths, and the service reads with more rights than the job's user:
an output file is read only inside the job's working directory or the cluster's
``output_prefixes``, never through a symbolic link, and only when it is a regular file owned by
the job's uid (``recovery.schedulers.output_files``). A refused file is recorded as
``input_ignored`` with the reason, once per workload, path and reason, and nothing else changes.
Kernel logs are paths an administrator set. They are read as the kernel writes them
(``recovery.detection.kernel_log``), never with the job-output signatures: the kernel prints
text a tenant chooses (a process name, a library's file name, a cgroup path), and a pattern
that matches anywhere in a line would read it as the driver's. The node of a kernel-log fact
is the host whose log it is, never a name in the text. Only hardware facts (an Xid decided by
its code, an uncorrectable PCIe or memory error, a NIC's firmware failing) become anomalies of
the workloads on that node and mark it unhealthy. A fact about a process (the OOM killer, a
segfault, an application's Xid) concerns that process's job alone, when the line names it by
Slurm's cgroup path; otherwise it is recorded as ``input_ignored`` with the reason, as are the
device facts not attributed to hardware and lines read as part of a record carrying user text.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from contextlib import closing
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from functools import partial
from typing import Protocol

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from recovery.audit.actors import Actor
from recovery.audit.record import record_event
from recovery.choices import (
    AttemptExitState,
    Attribution,
    AuditKind,
    EvidenceSource,
    NodeHealth,
    Severity,
    WorkloadState,
)
from recovery.detection.findings import Finding
from recovery.detection.kernel_log.facts import (
    OOM_EVENTS,
    DeviceFact,
    KernelEntry,
    KernelRead,
    ProcessEvent,
    ProcessFact,
)
from recovery.detection.kernel_log.reading import parse_kernel_log
from recovery.detection.kernel_log.reporting import findings as kernel_findings
from recovery.detection.scanner.log_scanner import LogScanner
from recovery.detection.scanner.progress_sampling import DEFAULT_NONFINITE_STEPS
from recovery.detection.scanner.results import NonfiniteState, ScanResult
from recovery.detection.signature_set import SignatureSet
from recovery.detection.teaching import LAST_LINES, last_lines
from recovery.loop.anomalies import RECENT_END, record_findings, record_read
from recovery.loop.patterns import active_signature_set
from recovery.loop.policy import policy_for
from recovery.models import (
    Attempt,
    AuditEvent,
    Cluster,
    LogCursor,
    Node,
    NodeLogCursor,
    Workload,
)
from recovery.schedulers.base import SchedulerError, Transport
from recovery.schedulers.output_files import OutputAccess, OutputRefused

logger = logging.getLogger(__name__)

MAX_READ_BYTES = 4 * 1024 * 1024
PROGRESS_SAMPLES = 256
PROGRESS_SAMPLES_PER_STREAM = 4
# How much of the end of each output file a failure nothing explained keeps: its last lines,
# never its whole log.
TAIL_BYTES = 64 * 1024


@dataclass
class IngestSummary:
    bytes_read: int = 0
    anomalies_new: int = 0
    checkpoints: int = 0
    truncations: int = 0
    # Output files a confinement rule kept from being read.
    refused: int = 0
    # Kernel-log facts that act on nothing: recorded as input_ignored, with the reason.
    ignored: int = 0


def ingest_workload_logs(
    workload: Workload, transport: Transport, *, now: datetime | None = None
) -> IngestSummary:
    summary = IngestSummary()
    access = output_access(workload)
    for path in dict.fromkeys(p for p in (workload.stdout_path, workload.stderr_path) if p):
        _ingest_file(workload, transport, path, access, now or timezone.now(), summary)
    return summary


def output_access(workload: Workload) -> OutputAccess:
    """Whose the workload's output files must be, and where they may lie: the job's working
    directory and the prefixes its cluster allows."""
    return OutputAccess(
        owner_uid=workload.user_uid,
        directories=(workload.work_dir, *output_prefixes(workload.cluster)),
    )


def output_prefixes(cluster: Cluster) -> tuple[str, ...]:
    """``connection_settings["output_prefixes"]``: directories, besides each job's working
    directory, that its output files may lie in (a shared scratch file system, say)."""
    configured = (cluster.connection_settings or {}).get("output_prefixes") or []
    if not isinstance(configured, list) or not all(isinstance(p, str) for p in configured):
        logger.warning(
            "output_prefixes of cluster %s must be a list of absolute paths; none is used",
            cluster.name,
        )
        return ()
    return tuple(configured)


def _ingest_file(
    workload: Workload,
    transport: Transport,
    path: str,
    access: OutputAccess,
    now: datetime,
    summary: IngestSummary,
) -> None:
    try:
        output = transport.open_output(path, access)
    except OutputRefused as refused:
        summary.refused += 1
        record_refused_output(workload, path, refused)
        return
    if output is None:
        return
    with closing(output), transaction.atomic():
        cursor, _ = LogCursor.objects.select_for_update().get_or_create(
            workload=workload, path=path
        )
        consumed = read_new_lines(output.read, output.size, cursor, summary)
        if consumed:
            result = scan_output(workload, cursor, consumed)
            new, saved = record_read(workload, result, now, source=EvidenceSource.JOB_OUTPUT)
            summary.anomalies_new += new
            summary.checkpoints += saved
        cursor.save()


def output_tail(workload: Workload, transport: Transport) -> list[str]:
    """The last lines the job printed (``teaching.last_lines``), read as its output is: through
    ``open_output``, under the same confinement, at most ``TAIL_BYTES`` of each file.

    For a failure nothing explained, so a person can see how it ended. A file that cannot be
    read now gives no lines; its refusal was recorded when the poll read it.
    """
    lines: list[str] = []
    access = output_access(workload)
    for path in dict.fromkeys(p for p in (workload.stdout_path, workload.stderr_path) if p):
        try:
            output = transport.open_output(path, access)
            if output is None:
                continue
            with closing(output):
                start = max(output.size - TAIL_BYTES, 0)
                data = output.read(start, output.size - start)
        except (OutputRefused, SchedulerError, OSError) as error:
            logger.warning("job %s: end of %s not read: %s", workload.job_id, path, error)
            continue
        lines += last_lines(data, cut_at_start=start > 0)
    return lines[-LAST_LINES:]


def record_refused_output(workload: Workload, path: str, refused: OutputRefused) -> bool:
    """Record once per workload, path and reason that an output file was not read, and why.

    Returns whether it was recorded now. A job keeps its paths for its whole life: recording
    every poll would bury the trail.
    """
    with transaction.atomic():
        # The workload's row serialises two workers polling the same cluster at once.
        list(Workload.objects.select_for_update().filter(pk=workload.pk).values_list("pk"))
        already = AuditEvent.objects.filter(
            workload=workload,
            kind=AuditKind.INPUT_IGNORED,
            payload__path=path,
            payload__reason=str(refused.reason),
        ).exists()
        if already:
            return False
        record_event(
            cluster=workload.cluster,
            workload=workload,
            attempt=workload.current_attempt or None,
            kind=AuditKind.INPUT_IGNORED,
            actor=Actor.POLLER,
            payload={"path": path, "reason": str(refused.reason), "detail": refused.detail},
        )
    logger.warning("job %s: output not read: %s", workload.job_id, refused)
    return True


class _Cursor(Protocol):
    offset: int
    truncations: int


def read_new_lines(
    read: Callable[[int, int], bytes], size: int, cursor: _Cursor, summary: IngestSummary
) -> bytes:
    """The complete lines written since ``cursor``, which is moved past them (not saved).

    ``read(offset, limit)`` reads the file, whose size was ``size``.
    """
    if size < cursor.offset:
        cursor.offset = 0
        cursor.truncations += 1
        summary.truncations += 1
    if size == cursor.offset:
        return b""
    data = read(cursor.offset, MAX_READ_BYTES)
    cut = data.rfind(b"\n") + 1
    if cut == 0 and len(data) < MAX_READ_BYTES:
        return b""  # only a partial line so far
    consumed = data[: cut or len(data)]
    cursor.offset += len(consumed)
    summary.bytes_read += len(consumed)
    return consumed


def scan(
    data: bytes,
    signatures: SignatureSet | None = None,
    *,
    nonfinite_steps: int = DEFAULT_NONFINITE_STEPS,
    nonfinite_state: NonfiniteState | None = None,
) -> ScanResult:
    """Scan one read; ``signatures`` defaults to the active set (a query to see it is current).

    ``nonfinite_state`` is what the previous read of the same output left (the result's
    ``nonfinite_state``), so a loss that stays NaN across polls is counted across them.
    """
    # Every rank's last few progress lines for the hang and straggler detectors, not only the
    # last few of each block; not all of them either: parsing and storing each one was a fifth
    # of a plain read's cost, and the detectors' windows span many reads.
    scanner = LogScanner(
        signatures or active_signature_set(),
        progress_samples_per_block=PROGRESS_SAMPLES,
        progress_samples_per_stream=PROGRESS_SAMPLES_PER_STREAM,
        nonfinite_steps=nonfinite_steps,
        nonfinite_state=nonfinite_state,
    )
    scanner.feed(data)
    return scanner.finish()


def scan_output(
    workload: Workload, cursor: LogCursor, data: bytes, signatures: SignatureSet | None = None
) -> ScanResult:
    """Scan a read of a workload's output file, carrying the cursor's non-finite loss count."""
    result = scan(
        data,
        signatures,
        nonfinite_steps=policy_for(workload).nonfinite_steps,
        nonfinite_state=cursor.nonfinite_streaks,
    )
    cursor.nonfinite_streaks = result.nonfinite_state
    return result


def ingest_node_kernel_logs(
    cluster: Cluster, transport: Transport, *, now: datetime | None = None
) -> IngestSummary:
    """Read each node's kernel log, when the cluster names one, and tie what it shows to the node.

    ``connection_settings["node_kernel_log"]`` is a path with ``{node}`` in it. A hardware fact
    seen there (an Xid the driver attributes to the GPU, an uncorrectable ECC or PCIe error)
    becomes an anomaly of every workload running on that node and marks the node unhealthy. A
    process fact becomes an anomaly of the job the line names, if it runs there, and of no
    other; what acts on nothing is recorded as ignored.
    """
    now = now or timezone.now()
    summary = IngestSummary()
    template = (cluster.connection_settings or {}).get("node_kernel_log")
    if not template:
        return summary
    on_nodes: dict[str, list[OnNode]] | None = None
    for node in Node.objects.filter(cluster=cluster):
        path = str(template).replace("{node}", node.name)
        size = transport.file_size(path)
        if size is None:
            continue
        with transaction.atomic():
            cursor, _ = NodeLogCursor.objects.select_for_update().get_or_create(
                node=node, path=path
            )
            consumed = read_new_lines(partial(transport.read_file, path), size, cursor, summary)
            if consumed:
                read = parse_kernel_log(consumed)
                if on_nodes is None:
                    on_nodes = attempts_by_node(cluster, now)
                here = on_nodes.get(node.name, [])
                hardware, not_hardware = _device_facts(read)
                result = kernel_result(kernel_findings(hardware, node.name), read, len(consumed))
                # Most reads hold no hardware fact: recording none would still cost a query
                # per workload on the node.
                for workload, attempt, _ in here if result.findings else []:
                    summary.anomalies_new += record_findings(
                        workload,
                        attempt,
                        result,
                        now,
                        scope=f"kernel:{node.name}",
                        source=EvidenceSource.KERNEL_LOG,
                    )
                created, ignored = _record_process_facts(node, read, here, now)
                summary.anomalies_new += created
                ignored |= {
                    KernelFactIgnored.NOT_HARDWARE: not_hardware,
                    KernelFactIgnored.CONTINUATION: read.in_continuations,
                    KernelFactIgnored.NOT_FROM_KERNEL: read.not_from_kernel,
                }
                _record_ignored(cluster, node, path, ignored, now, summary)
                _mark_node(node, result, now)
            cursor.save()
    return summary


class KernelFactIgnored(StrEnum):
    """Why a kernel-log fact acted on nothing (the ``reason`` of its ``input_ignored`` event)."""

    # A process fact (OOM killer, segfault, an application's Xid) whose line names no job.
    PROCESS_NAMES_NO_JOB = "process_fact_names_no_job"
    # The line names a job that is not running on this node (or not one recovery follows).
    JOB_NOT_ON_NODE = "process_fact_job_not_on_node"
    # A device fact the driver does not attribute to the hardware (an Xid of unknown cause).
    NOT_HARDWARE = "device_fact_not_hardware"
    # A line read as part of the record before it, which carries user text (a file name with
    # a newline in it would otherwise print a line of the tenant's choosing).
    CONTINUATION = "continuation_of_user_text"
    # A syslog line another program wrote.
    NOT_FROM_KERNEL = "not_from_the_kernel"


# One input_ignored event per node log and reason in this long: a tenant's program that
# segfaults every second must not bury the trail. The summary counts every fact.
IGNORED_EVENT_INTERVAL = timedelta(hours=1)
SHOWN_MESSAGE_CHARS = 300


def kernel_result(found: list[Finding], read: KernelRead, size: int) -> ScanResult:
    """A read of a kernel log in the shape ``record_findings`` takes: findings, no progress."""
    return ScanResult(
        findings=found,
        progress=[],
        checkpoints=[],
        lines=read.lines,
        bytes=size,
        progress_lines=0,
        checkpoint_lines=0,
        progress_after_last_failure=0,
        engine="kernel-log",
    )


def _device_facts(read: KernelRead) -> tuple[list[KernelEntry], list[KernelEntry]]:
    """The read's device facts about the node's hardware, and those the driver does not
    attribute to it."""
    hardware: list[KernelEntry] = []
    not_hardware: list[KernelEntry] = []
    for entry in read.entries:
        if isinstance(entry.fact, DeviceFact):
            (hardware if entry.fact.hardware else not_hardware).append(entry)
    return hardware, not_hardware


def _record_process_facts(
    node: Node, read: KernelRead, here: list[OnNode], now: datetime
) -> tuple[int, dict[KernelFactIgnored, list[KernelEntry]]]:
    """Each process fact naming a job that runs on ``node`` becomes an anomaly of that job
    alone. Returns the anomalies created and the other process facts, by why they are ignored.

    The job's anomaly implicates no node and needs the process to be seen to end, as a crash
    the job printed does: one process killed is not yet the job's failure.
    """
    by_job: dict[str, list[KernelEntry]] = {}
    named_pids: set[int | None] = set()
    unnamed: list[KernelEntry] = []
    elsewhere: list[KernelEntry] = []
    on_node = {workload.job_id: (workload, attempt) for workload, attempt, _ in here}
    for entry in read.entries:
        fact = entry.fact
        if not isinstance(fact, ProcessFact):
            continue
        if fact.job_id is None:
            unnamed.append(entry)
        elif fact.job_id in on_node and _owner_matches(on_node[fact.job_id][0], fact):
            by_job.setdefault(fact.job_id, []).append(entry)
            named_pids.add(fact.pid)
        else:
            elsewhere.append(entry)
    # The OOM killer's other lines of an event whose summary named the job are that event.
    unnamed = [e for e in unnamed if not _same_oom_event(e, named_pids, bool(by_job))]
    created = 0
    for job_id, entries in by_job.items():
        workload, attempt = on_node[job_id]
        result = kernel_result(kernel_findings(entries, node.name), read, 0)
        created += record_findings(
            workload,
            attempt,
            result,
            now,
            scope=f"kernel-process:{node.name}",
            source=EvidenceSource.KERNEL_LOG,
        )
    return created, {
        KernelFactIgnored.PROCESS_NAMES_NO_JOB: unnamed,
        KernelFactIgnored.JOB_NOT_ON_NODE: elsewhere,
    }


def _owner_matches(workload: Workload, fact: ProcessFact) -> bool:
    """The process's uid, as the kernel printed it, is the job's user's, where both are known."""
    return workload.user_uid is None or fact.uid is None or workload.user_uid == fact.uid


def _same_oom_event(entry: KernelEntry, named_pids: set[int | None], any_named: bool) -> bool:
    fact = entry.fact
    if not isinstance(fact, ProcessFact) or fact.event not in OOM_EVENTS:
        return False
    # The header names the task that asked for memory, not the victim: it has no pid to match.
    return fact.pid in named_pids or (fact.event == ProcessEvent.OOM_INVOKED and any_named)


def _record_ignored(
    cluster: Cluster,
    node: Node,
    path: str,
    ignored: dict[KernelFactIgnored, list[KernelEntry]],
    now: datetime,
    summary: IngestSummary,
) -> None:
    """Count the ignored entries, and say so in the trail once per log, reason and hour."""
    ignored = {reason: entries for reason, entries in ignored.items() if entries}
    if not ignored:
        return
    # One query for every reason: which of them this log's trail already shows this hour.
    recent = set(
        AuditEvent.objects.filter(
            cluster=cluster,
            workload=None,
            kind=AuditKind.INPUT_IGNORED,
            payload__path=path,
            occurred_at__gte=now - IGNORED_EVENT_INTERVAL,
        ).values_list("payload__reason", flat=True)
    )
    for reason, entries in ignored.items():
        summary.ignored += len(entries)
        logger.info("%s: %d kernel-log line(s) ignored: %s", node.name, len(entries), reason)
        if str(reason) in recent:
            continue
        kinds = sorted({entry.fact.signature for entry in entries})
        shown = entries[0].fact.message[:SHOWN_MESSAGE_CHARS]
        record_event(
            cluster=cluster,
            kind=AuditKind.INPUT_IGNORED,
            actor=Actor.POLLER,
            payload={
                "path": path,
                "reason": str(reason),
                "detail": (
                    f"{node.name}: {len(entries)} line(s) ({', '.join(kinds)}) acted on "
                    f"nothing; the first: {shown}"
                ),
            },
            occurred_at=now,
        )


OnNode = tuple[Workload, Attempt, bool]


def attempts_by_node(
    cluster: Cluster, now: datetime, nodes: Collection[str] | None = None
) -> dict[str, list[OnNode]]:
    """For each node (of ``nodes``, when given), the current attempts on it: running, or
    ended within ``RECENT_END``.

    Of each opted-in workload not yet completed or cancelled, its two newest attempts are
    looked at, the newer first; the first of them on a node that is running, or ended within
    ``RECENT_END``, is the workload's attempt on that node. Rows are read as plain values and
    objects are made only for the attempts that are on a node now (four queries at most).
    """
    workloads_now = {
        pk: (current, state)
        for pk, current, state in Workload.objects.filter(cluster=cluster, opted_in=True)
        .exclude(state__in=[WorkloadState.COMPLETED, WorkloadState.CANCELLED])
        .values_list("pk", "current_attempt", "state")
    }
    rows = (
        Attempt.objects.filter(
            workload__in=list(workloads_now), number__gte=F("workload__current_attempt") - 1
        )
        .order_by("workload_id", "-number")
        .values_list("pk", "workload_id", "number", "nodes", "exit_state", "ended_at")
    )
    wanted = set(nodes) if nodes is not None else None
    newest: dict[int, list[tuple[int, int, list[object], str, datetime | None]]] = {}
    for pk, workload_id, number, names, exit_state, ended_at in rows:
        kept = newest.setdefault(workload_id, [])
        if len(kept) < 2:
            kept.append(
                (pk, number, names if isinstance(names, list) else [], exit_state, ended_at)
            )
    found: dict[str, list[tuple[int, int, bool]]] = {}
    for workload_id, kept in newest.items():
        taken: set[str] = set()
        for pk, number, on, exit_state, ended_at in kept:
            ended = exit_state != AttemptExitState.RUNNING or ended_at is not None
            current, state = workloads_now[workload_id]
            running = not ended and current == number
            recent = ended and (ended_at or now) >= now - RECENT_END
            if not ((running and state == WorkloadState.RUNNING) or recent):
                continue
            names = {node for node in on if isinstance(node, str)}
            if wanted is not None:
                names &= wanted
            for node in names - taken:
                found.setdefault(node, []).append((workload_id, pk, running))
            taken |= names
    if not found:
        return {}
    wanted_workloads = {w for pairs in found.values() for w, _, _ in pairs}
    wanted_attempts = {a for pairs in found.values() for _, a, _ in pairs}
    workloads = Workload.objects.select_related("cluster").in_bulk(list(wanted_workloads))
    attempts = Attempt.objects.in_bulk(list(wanted_attempts))
    return {
        node: [(workloads[w], attempts[a], running) for w, a, running in pairs]
        for node, pairs in found.items()
    }


def _mark_node(node: Node, result: ScanResult, now: datetime) -> None:
    """Mark ``node`` unhealthy for a hardware failure its own kernel log shows."""
    hardware = [
        f
        for f in result.findings
        if f.severity != Severity.WARNING
        and f.attribution == Attribution.HARDWARE
        and f.implicates_nodes
        and f.nodes == [node.name]
    ]
    if not hardware:
        return
    node.health = NodeHealth.UNHEALTHY
    node.times_implicated += 1
    node.last_implicated_at = now
    node.save(update_fields=["health", "times_implicated", "last_implicated_at", "updated_at"])
