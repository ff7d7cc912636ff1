"""Reading job output files and node kernel logs from where the last read stopped.

Each read, its findings, its progress and the new offset are stored in one transaction, so a
worker killed mid-way re-reads the same bytes next time and records nothing twice. Only
complete lines are consumed; a partial last line waits for the next read. A file that became
shorter than the offset was truncated by a restart that does not append: it is read again
from the start as the new attempt's output.

What a read finds is recorded by ``recovery.loop.anomalies`` (``record_read``,
``record_findings``), the same step that pushed lines and log stores go through.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from django.db import transaction
from django.utils import timezone

from recovery.choices import AttemptExitState, Attribution, NodeHealth, Severity, WorkloadState
from recovery.detection.scanner import LogScanner, ScanResult
from recovery.loop.anomalies import RECENT_END, record_findings, record_read
from recovery.loop.patterns import active_signature_set
from recovery.models import Attempt, Cluster, LogCursor, Node, NodeLogCursor, Workload
from recovery.sources.schedulers.base import Transport

MAX_READ_BYTES = 4 * 1024 * 1024
PROGRESS_SAMPLES = 256


@dataclass
class IngestSummary:
    bytes_read: int = 0
    anomalies_new: int = 0
    checkpoints: int = 0
    truncations: int = 0


def ingest_workload_logs(
    workload: Workload, transport: Transport, *, now: datetime | None = None
) -> IngestSummary:
    summary = IngestSummary()
    for path in dict.fromkeys(p for p in (workload.stdout_path, workload.stderr_path) if p):
        _ingest_file(workload, transport, path, now or timezone.now(), summary)
    return summary


def _ingest_file(
    workload: Workload, transport: Transport, path: str, now: datetime, summary: IngestSummary
) -> None:
    size = transport.file_size(path)
    if size is None:
        return
    with transaction.atomic():
        cursor, _ = LogCursor.objects.select_for_update().get_or_create(
            workload=workload, path=path
        )
        consumed = read_new_lines(transport, path, size, cursor, summary)
        if consumed:
            new, saved = record_read(workload, scan(consumed), now)
            summary.anomalies_new += new
            summary.checkpoints += saved
        cursor.save()


class _Cursor(Protocol):
    offset: int
    truncations: int


def read_new_lines(
    transport: Transport, path: str, size: int, cursor: _Cursor, summary: IngestSummary
) -> bytes:
    """The complete lines written since ``cursor``, which is moved past them (not saved)."""
    if size < cursor.offset:
        cursor.offset = 0
        cursor.truncations += 1
        summary.truncations += 1
    if size == cursor.offset:
        return b""
    data = transport.read_file(path, cursor.offset, MAX_READ_BYTES)
    cut = data.rfind(b"\n") + 1
    if cut == 0 and len(data) < MAX_READ_BYTES:
        return b""  # only a partial line so far
    consumed = data[: cut or len(data)]
    cursor.offset += len(consumed)
    summary.bytes_read += len(consumed)
    return consumed


def scan(data: bytes) -> ScanResult:
    # A poll reads a few seconds of output: keep every rank's progress lines for the hang and
    # straggler detectors, not only the last few of each block.
    scanner = LogScanner(active_signature_set(), progress_samples_per_block=PROGRESS_SAMPLES)
    scanner.feed(data)
    return scanner.finish()


def ingest_node_kernel_logs(
    cluster: Cluster, transport: Transport, *, now: datetime | None = None
) -> IngestSummary:
    """Read each node's kernel log, when the cluster names one, and tie what it shows to the node.

    ``connection_settings["node_kernel_log"]`` is a path with ``{node}`` in it. A failure seen
    there (an Xid, an ECC error) becomes an anomaly of every workload running on that node, and
    hardware evidence marks the node unhealthy.
    """
    now = now or timezone.now()
    summary = IngestSummary()
    template = (cluster.connection_settings or {}).get("node_kernel_log")
    if not template:
        return summary
    for node in Node.objects.filter(cluster=cluster):
        path = str(template).replace("{node}", node.name)
        size = transport.file_size(path)
        if size is None:
            continue
        with transaction.atomic():
            cursor, _ = NodeLogCursor.objects.select_for_update().get_or_create(
                node=node, path=path
            )
            consumed = read_new_lines(transport, path, size, cursor, summary)
            if consumed:
                result = scan(consumed)
                for finding in result.findings:
                    if node.name not in finding.nodes:
                        finding.nodes.append(node.name)
                for workload, attempt, _ in attempts_on_node(cluster, node.name, now):
                    summary.anomalies_new += record_findings(
                        workload, attempt, result, now, scope=f"kernel:{node.name}"
                    )
                _mark_node(node, result, now)
            cursor.save()
    return summary


def attempts_on_node(
    cluster: Cluster, node: str, now: datetime
) -> list[tuple[Workload, Attempt, bool]]:
    """Current attempts on ``node``, running or ended within ``RECENT_END``."""
    found = []
    workloads = Workload.objects.filter(cluster=cluster, opted_in=True).exclude(
        state__in=[WorkloadState.COMPLETED, WorkloadState.CANCELLED]
    )
    for workload in workloads.select_related("cluster"):
        attempts = Attempt.objects.filter(workload=workload).order_by("-number")[:2]
        for attempt in attempts:
            if node not in attempt.nodes:
                continue
            ended = attempt.exit_state != AttemptExitState.RUNNING or attempt.ended_at is not None
            running = not ended and workload.current_attempt == attempt.number
            recent = ended and (attempt.ended_at or now) >= now - RECENT_END
            if (running and workload.state == WorkloadState.RUNNING) or recent:
                found.append((workload, attempt, running))
                break
    return found


def _mark_node(node: Node, result: ScanResult, now: datetime) -> None:
    hardware = [
        f
        for f in result.findings
        if f.severity != Severity.WARNING and f.attribution == Attribution.HARDWARE
    ]
    if not hardware:
        return
    node.health = NodeHealth.UNHEALTHY
    node.times_implicated += 1
    node.last_implicated_at = now
    node.save(update_fields=["health", "times_implicated", "last_implicated_at", "updated_at"])
