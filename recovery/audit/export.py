"""The audit trail as CSV: the events some ``AuditFilters`` select, newest first.

Read in bounded keyset batches (``CSV_BATCH_SIZE``), so a million rows never sit in memory at
once, and streamed as text chunks: a plain iterator for a WSGI server, an async one for ASGI.
Every text cell is guarded against spreadsheet formulas (CSV injection).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from datetime import UTC, datetime

from asgiref.sync import sync_to_async

from recovery.audit.trail import AuditFilters, fetch_events, older_than, select_events

CSV_BATCH_SIZE = 2000
CSV_COLUMNS = (
    "id",
    "occurred_at",
    "cluster",
    "workload_id",
    "job_id",
    "attempt",
    "kind",
    "actor",
    "payload",
)
# A spreadsheet runs a cell that starts with one of these as a formula (CSV injection).
FORMULA_TRIGGERS = ("=", "+", "-", "@", "\t", "\r")


def guard_cell(value: str) -> str:
    """Keep a spreadsheet from running a cell as a formula: prefix an apostrophe."""
    if value.startswith(FORMULA_TRIGGERS):
        return "'" + value
    return value


CsvSource = tuple[int, datetime, str, int | None, str | None, int | None, str, str, object]


def csv_row(values: CsvSource) -> list[str]:
    """One event as CSV cells, in ``CSV_COLUMNS`` order."""
    event_id, occurred_at, cluster, workload_id, job_id, attempt, kind, actor, payload = values
    return [
        str(event_id),
        iso_utc(occurred_at),
        guard_cell(cluster),
        "" if workload_id is None else str(workload_id),
        guard_cell(job_id or ""),
        "" if attempt is None else str(attempt),
        guard_cell(kind),
        guard_cell(actor),
        guard_cell(
            json.dumps(
                payload, ensure_ascii=False, sort_keys=True, separators=(",", ":"), default=str
            )
        ),
    ]


def iso_utc(value: datetime) -> str:
    """ISO 8601 in UTC with a Z, microseconds only when there are some."""
    value = value.astimezone(UTC)
    text = value.strftime("%Y-%m-%dT%H:%M:%S")
    if value.microsecond:
        text += f".{value.microsecond:06d}"
    return text + "Z"


def csv_filename(filters: AuditFilters, now: datetime) -> str:
    """``audit-trail_[cluster_]<from>_to_<to>.csv``, with the instants the export covers."""

    def stamp(value: datetime) -> str:
        return value.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")

    start = stamp(filters.since) if filters.since else "beginning"
    end = stamp(filters.until) if filters.until else stamp(now)
    # Cluster names are letters, digits, '.', '_' and '-' (cluster_name_validator).
    prefix = f"audit-trail_{filters.cluster}_" if filters.cluster else "audit-trail_"
    return f"{prefix}{start}_to_{end}.csv"


def csv_batch(
    filters: AuditFilters, after: tuple[datetime, int] | None, size: int
) -> list[CsvSource]:
    """The next ``size`` matching events (newest first) older than ``after``, as tuples.

    A bounded keyset query per batch: MySQL drivers buffer a whole result set on the client,
    so one unbounded query, even read with ``.iterator()``, would hold every row in memory.
    """
    where = older_than(*after) if after is not None else None
    events = fetch_events(select_events(filters), where=where, limit=size)
    return [
        (
            event.pk,
            event.occurred_at,
            event.cluster.name,
            event.workload_id,
            event.workload.job_id if event.workload is not None else None,
            event.attempt,
            event.kind,
            event.actor,
            event.payload,
        )
        for event in events
    ]


def _csv_text(rows: Iterable[Sequence[str]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerows(rows)
    return buffer.getvalue()


def csv_header() -> str:
    return _csv_text([CSV_COLUMNS])


def csv_lines(filters: AuditFilters, *, batch_size: int | None = None) -> Iterator[str]:
    """The export, one chunk of text per batch of ``CSV_BATCH_SIZE``, for a WSGI server."""
    batch_size = batch_size or CSV_BATCH_SIZE
    yield csv_header()
    after: tuple[datetime, int] | None = None
    while True:
        batch = csv_batch(filters, after, batch_size)
        if batch:
            yield _csv_text(csv_row(values) for values in batch)
        if len(batch) < batch_size:
            return
        after = (batch[-1][1], batch[-1][0])


async def acsv_lines(filters: AuditFilters, *, batch_size: int | None = None) -> AsyncIterator[str]:
    """The same export for an ASGI server: given a plain iterator, Django under ASGI would
    read it whole into a list before sending the first byte."""
    batch_size = batch_size or CSV_BATCH_SIZE
    yield csv_header()
    after: tuple[datetime, int] | None = None
    while True:
        batch = await sync_to_async(csv_batch)(filters, after, batch_size)
        if batch:
            yield _csv_text(csv_row(values) for values in batch)
        if len(batch) < batch_size:
            return
        after = (batch[-1][1], batch[-1][0])
