"""Feeding a job's lines from a log store into the same detectors as its output files.

The read position is a ``LogCursor`` of the workload whose ``path`` names the store and query
(``loki:{slurm_job_id="4242"}``) and whose ``offset`` is the last timestamp read, in
nanoseconds. The fetch, its findings and the new offset are stored in one transaction, so a
worker killed mid-way reads the same lines again next time and records nothing twice.

What the store holds is what the job printed: the lines, and the node and rank labels its
shipper put on them, are the user's to write (``EvidenceSource.LOG_STORE``, user trust). A
node they name is at most kept out of this job's next attempt; it never counts towards a
suspect, unhealthy or drained node. The job label is what says whose lines they are: it is
trusted only as far as the store (or the tenant of it the mapping reads, pinned by the
mapping's static selectors) takes writes from the site's shippers alone. A store tenants can
push to with labels of their choosing would let one job's lines be read as another's.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from recovery.choices import EvidenceSource
from recovery.detection.findings import Finding
from recovery.loop.anomalies import record_read
from recovery.loop.logs import IngestSummary, scan_output
from recovery.models import LogCursor, Workload
from recovery.sources.logs.base import LogRecord, LogSource, render, to_ns

# Log shippers deliver late; lines younger than this are left for the next poll, so a line
# that arrives after a later one was read is not skipped.
SETTLE = timedelta(seconds=10)
# The first read starts a little before submission: clocks differ between hosts.
FIRST_READ_MARGIN = timedelta(minutes=5)
MAX_LINES_PER_POLL = 20_000


def ingest_from_source(
    workload: Workload,
    source: LogSource,
    now: datetime | None = None,
    *,
    max_lines: int = MAX_LINES_PER_POLL,
) -> IngestSummary:
    """Read ``workload``'s new lines from ``source`` and record what the detectors find.

    Raises ``LogSourceError`` when the store can't be read; the cursor is then left where it
    was.
    """
    now = now or timezone.now()
    summary = IngestSummary()
    until = to_ns(now - SETTLE)
    with transaction.atomic():
        cursor, _ = LogCursor.objects.select_for_update().get_or_create(
            workload=workload, path=source.cursor_key(workload.job_id)
        )
        since = (
            cursor.offset + 1 if cursor.offset else to_ns(workload.submit_time - FIRST_READ_MARGIN)
        )
        if since >= until:
            return summary
        records = source.fetch(workload.job_id, since, until, limit=max_lines)
        if not records:
            return summary
        data, line_records = render(records)
        summary.bytes_read = len(data)
        result = scan_output(workload, cursor, data)
        _attribute_lines(result.findings, line_records)
        summary.anomalies_new, summary.checkpoints = record_read(
            workload, result, now, source=EvidenceSource.LOG_STORE
        )
        cursor.offset = records[-1].timestamp_ns
        cursor.save()
    return summary


def _attribute_lines(findings: list[Finding], owners: list[LogRecord]) -> None:
    """Name the node and rank of a finding's first and last line from the store's labels.

    The prefixes cover names the scanner recognises; this covers the rest (``GPU-Host-A``).
    """
    for finding in findings:
        for number in (finding.first_line, finding.detail.get("last_line")):
            if not isinstance(number, int) or not 1 <= number <= len(owners):
                continue
            record = owners[number - 1]
            if record.node:
                finding.name_node(record.node)
            if record.rank is not None:
                finding.name_rank(record.rank)
