"""Reading the audit trail: filters from query parameters, keyset pages, neighbours and CSV rows.

The Console's audit views stay thin and call these plain functions; each is testable without
HTTP. The table holds millions of rows, so every query here:

- reads the audit table alone (names are resolved to ids first) and orders by
  ``(occurred_at, id)``, which the indexes ``(cluster|workload|kind|actor, occurred_at)`` serve
  directly: InnoDB appends the primary key to every secondary index, so the ``id`` tie-break
  needs no sort. On MySQL/MariaDB the query names those indexes (see ``fetch_events``);
- pages with a keyset cursor instead of OFFSET, and never counts the matching rows;
- reads the CSV export in bounded keyset batches, so a million rows never sit in memory at once.
"""

from __future__ import annotations

import base64
import binascii
import csv
import io
import json
import re
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from asgiref.sync import sync_to_async
from django.core.exceptions import EmptyResultSet
from django.db import connections
from django.db.models import Prefetch, Q, QuerySet, prefetch_related_objects
from django.http import QueryDict

from recovery.choices import AuditKind
from recovery.models import AuditEvent, Cluster, Workload

PAGE_SIZE = 100
CSV_BATCH_SIZE = 2000
NEIGHBOUR_COUNT = 5
# "cluster:job id" may name several workloads (Slurm reuses job ids); read at most this many.
_MAX_REUSED_JOB_IDS = 100

# Quick ranges are relative, so a live first page keeps showing "the last hour" as time passes.
QUICK_RANGES: dict[str, tuple[str, timedelta]] = {
    "1h": ("Last hour", timedelta(hours=1)),
    "24h": ("Last 24 hours", timedelta(hours=24)),
    "7d": ("Last 7 days", timedelta(days=7)),
}

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

_KIND_ORDER = {value: position for position, value in enumerate(AuditKind.values)}
_ACTOR_MAX_LENGTH = AuditEvent._meta.get_field("actor").max_length or 150
_JOB_ID_MAX_LENGTH = Workload._meta.get_field("job_id").max_length or 64
_MAX_ID = 2**63 - 1  # BIGINT: a larger number cannot be an id, and MariaDB would reject it
_EARLIEST_YEAR = 1970
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

Direction = Literal["older", "newer"]


# ---------- filters ----------


@dataclass(frozen=True)
class WorkloadRef:
    """A workload named either by its id or by ``cluster:job id`` (job ids are reused, so the
    second form may match several workloads)."""

    workload_id: int | None = None
    cluster: str = ""
    job_id: str = ""

    def __str__(self) -> str:
        if self.workload_id is not None:
            return str(self.workload_id)
        return f"{self.cluster}:{self.job_id}"


@dataclass(frozen=True)
class AuditFilters:
    """Valid filters only: whatever failed to parse is already left out."""

    cluster: str = ""
    workload: WorkloadRef | None = None
    kinds: tuple[str, ...] = ()
    actor: str = ""
    quick_range: str = ""
    since: datetime | None = None  # inclusive, UTC
    until: datetime | None = None  # inclusive, UTC; None with a quick range means "now"

    @property
    def any(self) -> bool:
        return bool(
            self.cluster
            or self.workload
            or self.kinds
            or self.actor
            or self.quick_range
            or self.since
            or self.until
        )

    def query_params(self) -> list[tuple[str, str]]:
        """The filters as query parameters, for links that must show the same events."""
        params: list[tuple[str, str]] = []
        if self.cluster:
            params.append(("cluster", self.cluster))
        if self.workload:
            params.append(("workload", str(self.workload)))
        params.extend(("kind", kind) for kind in self.kinds)
        if self.actor:
            params.append(("actor", self.actor))
        if self.quick_range:
            params.append(("range", self.quick_range))
        else:
            if self.since:
                params.append(("from", datetime_local(self.since)))
            if self.until:
                params.append(("to", datetime_local(self.until)))
        return params

    def with_quick_range(self, key: str) -> AuditFilters:
        """These filters over one of ``QUICK_RANGES`` (or any time for ``""``) instead."""
        return replace(self, quick_range=key, since=None, until=None)


@dataclass(frozen=True)
class FilterProblem:
    """A filter value that was ignored, and why, in words for the operator."""

    field: str
    message: str


@dataclass
class ParsedFilters:
    filters: AuditFilters
    problems: list[FilterProblem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # What the form shows again: the typed text even when it was invalid, so it can be fixed.
    form: dict[str, Any] = field(default_factory=dict)

    def problems_for(self, name: str) -> list[str]:
        return [problem.message for problem in self.problems if problem.field == name]

    @property
    def invalid_fields(self) -> set[str]:
        return {problem.field for problem in self.problems}


def parse_filters(
    params: QueryDict,
    *,
    now: datetime,
    known_clusters: Collection[str] | None = None,
) -> ParsedFilters:
    """Turn query parameters into filters; every bad value is ignored with a reason.

    Parameters: ``cluster`` (name), ``workload`` (id or ``cluster:job id``), ``kind`` (repeated
    or comma-separated ``AuditKind`` values), ``actor`` (exact), ``from`` and ``to`` (ISO 8601,
    as a datetime-local input sends them; read as UTC when they carry no offset) and ``range``
    (a key of ``QUICK_RANGES``, which replaces from/to). ``known_clusters`` lets an unknown
    cluster name be reported instead of silently matching nothing.
    """
    problems: list[FilterProblem] = []
    notes: list[str] = []
    form: dict[str, Any] = {}

    cluster = _text(params, "cluster")
    form["cluster"] = cluster
    if cluster and known_clusters is not None and cluster not in known_clusters:
        problems.append(
            FilterProblem("cluster", f"No cluster is named “{cluster}”; showing every cluster.")
        )
        cluster = ""
        form["cluster"] = ""

    workload_text = _text(params, "workload")
    form["workload"] = workload_text
    workload: WorkloadRef | None = None
    if workload_text:
        try:
            workload = parse_workload_ref(workload_text)
        except ValueError as error:
            problems.append(FilterProblem("workload", str(error)))

    kinds, unknown_kinds = _parse_kinds(params.getlist("kind"))
    form["kinds"] = kinds
    for unknown in unknown_kinds:
        problems.append(
            FilterProblem("kind", f"There is no event kind “{_shorten(unknown)}”; it is ignored.")
        )

    actor = _text(params, "actor")
    form["actor"] = actor
    if len(actor) > _ACTOR_MAX_LENGTH:
        problems.append(
            FilterProblem(
                "actor",
                f"An actor is at most {_ACTOR_MAX_LENGTH} characters; the actor filter is ignored.",
            )
        )
        actor = ""

    since, since_problem = _parse_bound(params, "from", "From")
    until, until_problem = _parse_bound(params, "to", "To")
    problems.extend(problem for problem in (since_problem, until_problem) if problem)
    form["from"] = datetime_local(since) if since else _text(params, "from")
    form["to"] = datetime_local(until) if until else _text(params, "to")

    quick_range = _text(params, "range")
    if quick_range and quick_range not in QUICK_RANGES:
        choices = ", ".join(QUICK_RANGES)
        problems.append(
            FilterProblem(
                "range",
                f"“{_shorten(quick_range)}” is not a quick range (use {choices}); it is ignored.",
            )
        )
        quick_range = ""
    form["range"] = quick_range

    if quick_range:
        label, span = QUICK_RANGES[quick_range]
        if since or until:
            notes.append(f"“{label}” replaces the From and To dates.")
            form["from"] = form["to"] = ""
        since, until = now - span, None
    elif since and until and until < since:
        problems.append(FilterProblem("to", "“To” is before “From”, so the time range is ignored."))
        since = until = None

    filters = AuditFilters(
        cluster=cluster,
        workload=workload,
        kinds=kinds,
        actor=actor,
        quick_range=quick_range,
        since=since,
        until=until,
    )
    return ParsedFilters(filters=filters, problems=problems, notes=notes, form=form)


def parse_workload_ref(text: str) -> WorkloadRef:
    """``"123"`` (a workload id) or ``"lab:40001"`` (a job id on a cluster)."""
    if text.isdigit():
        workload_id = int(text)
        if not 0 < workload_id <= _MAX_ID:
            raise ValueError(f"No workload can have the id {_shorten(text)}; it is ignored.")
        return WorkloadRef(workload_id=workload_id)
    cluster, colon, job_id = text.partition(":")
    cluster, job_id = cluster.strip(), job_id.strip()
    if colon and cluster and job_id and len(job_id) <= _JOB_ID_MAX_LENGTH:
        return WorkloadRef(cluster=cluster, job_id=job_id)
    raise ValueError(
        f"“{_shorten(text)}” is not a workload: use its number (e.g. 42) "
        "or cluster:job id (e.g. lab:40001). The workload filter is ignored."
    )


def _parse_kinds(values: Iterable[str]) -> tuple[tuple[str, ...], list[str]]:
    wanted: set[str] = set()
    unknown: list[str] = []
    for value in values:
        for part in value.split(","):
            kind = part.strip()
            if not kind:
                continue
            if kind in _KIND_ORDER:
                wanted.add(kind)
            elif kind not in unknown:
                unknown.append(kind)
    return tuple(sorted(wanted, key=_KIND_ORDER.__getitem__)), unknown


def _parse_bound(
    params: QueryDict, name: str, label: str
) -> tuple[datetime | None, FilterProblem | None]:
    text = _text(params, name)
    if not text:
        return None, None
    try:
        return parse_instant(text), None
    except ValueError:
        return None, FilterProblem(
            name,
            f"“{label}” is not a date and time: “{_shorten(text)}” "
            "(expected YYYY-MM-DDTHH:MM in UTC). It is ignored.",
        )


def parse_instant(text: str) -> datetime:
    """An ISO 8601 date and time, as UTC; one without an offset is taken to be UTC already."""
    try:
        value = datetime.fromisoformat(text)
        value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except (ValueError, OverflowError) as error:
        raise ValueError(f"not an ISO 8601 date and time: {text!r}") from error
    if value.year < _EARLIEST_YEAR:
        raise ValueError(f"before {_EARLIEST_YEAR}: {text!r}")
    return value


def datetime_local(value: datetime) -> str:
    """The value of a datetime-local input for an instant, in UTC; seconds only when needed."""
    value = value.astimezone(UTC)
    if value.second or value.microsecond:
        return value.strftime("%Y-%m-%dT%H:%M:%S")
    return value.strftime("%Y-%m-%dT%H:%M")


def _text(params: QueryDict, name: str) -> str:
    value = params.get(name, "")
    return value.strip() if isinstance(value, str) else ""


def _shorten(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ---------- the query ----------


@dataclass(frozen=True)
class Selection:
    """The events some filters select: a query on the audit table alone, and the indexes that
    can serve it in (occurred_at, id) order."""

    events: QuerySet[AuditEvent]
    indexes: tuple[str, ...] = ()


def _index_named(*fields: str) -> str:
    return next(index.name for index in AuditEvent._meta.indexes if tuple(index.fields) == fields)


def select_events(filters: AuditFilters) -> Selection:
    """The events the filters select, unordered.

    Names are resolved to ids first (one small indexed lookup each), so the query reads the
    audit table alone: a join lets MariaDB start from the other table and sort a million rows.
    """
    events = AuditEvent.objects.all()
    indexes: list[str] = []
    if filters.workload:
        ref = filters.workload
        if ref.workload_id is not None:
            events = events.filter(workload_id=ref.workload_id)
        else:
            workload_ids = list(
                Workload.objects.filter(cluster__name=ref.cluster, job_id=ref.job_id)
                .order_by()
                .values_list("pk", flat=True)[:_MAX_REUSED_JOB_IDS]
            )
            events = events.filter(workload_id__in=workload_ids)
        indexes.append(_index_named("workload", "occurred_at"))
    if filters.actor:
        events = events.filter(actor=filters.actor)
        indexes.append(_index_named("actor", "occurred_at"))
    if len(filters.kinds) == 1:
        events = events.filter(kind=filters.kinds[0])
        indexes.append(_index_named("kind", "occurred_at"))
    elif filters.kinds:
        # Several kinds are several ranges of the kind index, which would need a sort; the
        # occurred_at index or another filter's index serves them better.
        events = events.filter(kind__in=filters.kinds)
    if filters.cluster:
        cluster_id = Cluster.objects.filter(name=filters.cluster).values_list("pk", flat=True)
        events = events.filter(cluster_id=cluster_id.first() or 0)
        indexes.append(_index_named("cluster", "occurred_at"))
    if filters.since:
        events = events.filter(occurred_at__gte=filters.since)
    if filters.until:
        events = events.filter(occurred_at__lte=filters.until)
    return Selection(events, tuple(indexes))


def audit_events(filters: AuditFilters) -> QuerySet[AuditEvent]:
    """The events the filters select, as a plain queryset (unordered)."""
    return select_events(filters).events


def _older_than(occurred_at: datetime, event_id: int) -> Q:
    # The redundant ``occurred_at <= t`` gives MariaDB a plain range to walk the index with.
    return Q(occurred_at__lte=occurred_at) & (Q(occurred_at__lt=occurred_at) | Q(id__lt=event_id))


def _newer_than(occurred_at: datetime, event_id: int) -> Q:
    return Q(occurred_at__gte=occurred_at) & (Q(occurred_at__gt=occurred_at) | Q(id__gt=event_id))


NEWEST_FIRST = ("-occurred_at", "-id")
OLDEST_FIRST = ("occurred_at", "id")


def fetch_events(
    selection: Selection,
    *,
    where: Q | None = None,
    order: tuple[str, ...] = NEWEST_FIRST,
    limit: int,
) -> list[AuditEvent]:
    """At most ``limit`` selected events in ``order``, each with its cluster and workload.

    On MySQL/MariaDB the query names the indexes of its equality filters (FORCE INDEX). Left
    to itself, MariaDB 10.11 reads ``cluster_id = 2 AND occurred_at <= t ORDER BY occurred_at
    DESC`` through the index's first column only, then skips every newer row one by one: a
    second or more on a deep page of a million events, against a millisecond with the hint.
    """
    events = selection.events if where is None else selection.events.filter(where)
    query = events.order_by(*order)[:limit]
    try:
        sql, params = query.query.sql_with_params()
    except EmptyResultSet:  # e.g. ``workload_id IN ()``: nothing can match
        return []
    connection = connections[query.db]
    if selection.indexes and connection.vendor == "mysql":
        sql = _force_indexes(sql, selection.indexes, connection.ops.quote_name)
    rows = list(AuditEvent.objects.raw(sql, params))
    prefetch_related_objects(
        rows, "cluster", Prefetch("workload", queryset=Workload.objects.only("job_id", "name"))
    )
    return rows


def _force_indexes(sql: str, indexes: Sequence[str], quote: Callable[[str], str]) -> str:
    table = quote(AuditEvent._meta.db_table)
    source = f"FROM {table} "
    if sql.count(source) != 1:
        return sql  # not the single-table query this expects: leave it to the optimizer
    hint = ", ".join(quote(name) for name in indexes)
    return sql.replace(source, f"FROM {table} FORCE INDEX ({hint}) ", 1)


# ---------- keyset cursors ----------


class InvalidCursor(ValueError):
    """A page link whose cursor cannot be read."""


@dataclass(frozen=True)
class Cursor:
    """Where a page starts: the events older (or newer) than one event's (occurred_at, id)."""

    direction: Direction
    occurred_at: datetime
    event_id: int


def encode_cursor(cursor: Cursor) -> str:
    """An opaque, URL-safe token; only ``decode_cursor`` needs to understand it."""
    micros = (cursor.occurred_at - _EPOCH) // timedelta(microseconds=1)
    raw = f"{cursor.direction[0]}.{micros}.{cursor.event_id}"
    return base64.urlsafe_b64encode(raw.encode("ascii")).decode("ascii").rstrip("=")


_CURSOR_RE = re.compile(r"([on])\.(-?\d{1,19})\.(\d{1,19})")


def decode_cursor(token: str) -> Cursor:
    """The cursor in a page link; raises ``InvalidCursor`` for anything it did not make."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode("ascii")
    except (binascii.Error, ValueError) as error:
        raise InvalidCursor("the page link is damaged") from error
    match = _CURSOR_RE.fullmatch(raw)
    if not match:
        raise InvalidCursor("the page link is damaged")
    letter, micros, event_id = match.groups()
    try:
        occurred_at = _EPOCH + timedelta(microseconds=int(micros))
    except OverflowError as error:
        raise InvalidCursor("the page link points outside the calendar") from error
    if not 0 < int(event_id) <= _MAX_ID:
        raise InvalidCursor("the page link names no event")
    direction: Direction = "older" if letter == "o" else "newer"
    return Cursor(direction, occurred_at, int(event_id))


def cursor_at(event: AuditEvent) -> str:
    """A cursor for the page that starts with this event (newest first)."""
    # "Older than (t, id + 1)" keeps the event itself and everything after it in the order.
    return encode_cursor(Cursor("older", event.occurred_at, event.pk + 1))


# ---------- pages ----------


@dataclass
class EventPage:
    events: list[AuditEvent]
    newer_cursor: str | None
    older_cursor: str | None
    # The newest events: the page a live update refreshes in place.
    is_newest: bool


def events_page(
    filters: AuditFilters, cursor: Cursor | None = None, *, size: int | None = None
) -> EventPage:
    """One page of events (``PAGE_SIZE`` unless told), newest first, starting at the cursor.

    Reads one row more than the page to know whether another page follows, and never counts.
    """
    size = size or PAGE_SIZE
    selection = select_events(filters)
    if cursor is None:
        return _newest_page(selection, size)
    if cursor.direction == "older":
        rows = fetch_events(
            selection, where=_older_than(cursor.occurred_at, cursor.event_id), limit=size + 1
        )
        events = rows[:size]
        # Newer events exist (at least the one the cursor came from): link back to them, from
        # this page's first event or, past the end of the trail, from the cursor itself.
        top = (
            (events[0].occurred_at, events[0].pk)
            if events
            else (cursor.occurred_at, cursor.event_id)
        )
        return EventPage(
            events=events,
            newer_cursor=encode_cursor(Cursor("newer", *top)),
            older_cursor=_cursor_after(events, "older") if len(rows) > size else None,
            is_newest=False,
        )
    rows = fetch_events(
        selection,
        where=_newer_than(cursor.occurred_at, cursor.event_id),
        order=OLDEST_FIRST,
        limit=size + 1,
    )
    if len(rows) <= size:
        # Back at the top: show a full newest page, which live updates keep current.
        return _newest_page(selection, size)
    events = rows[:size][::-1]
    return EventPage(
        events=events,
        newer_cursor=encode_cursor(Cursor("newer", events[0].occurred_at, events[0].pk)),
        older_cursor=_cursor_after(events, "older"),
        is_newest=False,
    )


def _newest_page(selection: Selection, size: int) -> EventPage:
    rows = fetch_events(selection, limit=size + 1)
    events = rows[:size]
    return EventPage(
        events=events,
        newer_cursor=None,
        older_cursor=_cursor_after(events, "older") if len(rows) > size else None,
        is_newest=True,
    )


def _cursor_after(events: Sequence[AuditEvent], direction: Direction) -> str:
    last = events[-1]
    return encode_cursor(Cursor(direction, last.occurred_at, last.pk))


# ---------- one event ----------


def find_event(event_id: int) -> AuditEvent | None:
    if not 0 < event_id <= _MAX_ID:
        return None
    return AuditEvent.objects.select_related("cluster", "workload").filter(pk=event_id).first()


@dataclass
class Neighbourhood:
    """Events around one event, oldest first, in the event's workload (or its cluster when it
    belongs to no workload)."""

    before: list[AuditEvent]
    after: list[AuditEvent]
    scope: Literal["workload", "cluster"]


def neighbours(event: AuditEvent, count: int = NEIGHBOUR_COUNT) -> Neighbourhood:
    if event.workload_id is not None:
        scope: Literal["workload", "cluster"] = "workload"
        nearby = Selection(
            AuditEvent.objects.filter(workload_id=event.workload_id),
            (_index_named("workload", "occurred_at"),),
        )
    else:
        scope = "cluster"
        nearby = Selection(
            AuditEvent.objects.filter(cluster_id=event.cluster_id),
            (_index_named("cluster", "occurred_at"),),
        )
    before = fetch_events(nearby, where=_older_than(event.occurred_at, event.pk), limit=count)
    after = fetch_events(
        nearby, where=_newer_than(event.occurred_at, event.pk), order=OLDEST_FIRST, limit=count
    )
    return Neighbourhood(before=before[::-1], after=after, scope=scope)


def payload_items(payload: object) -> list[tuple[str, object]]:
    """A mapping payload's keys and values, for compact display; empty for any other payload.

    Done here rather than with ``payload.items`` in a template, which would read a key named
    "items" instead.
    """
    if isinstance(payload, dict):
        return [(str(key), value) for key, value in payload.items()]
    return []


def pretty_payload(payload: object) -> str:
    return json.dumps(payload, indent=2, sort_keys=True, ensure_ascii=False, default=str)


# ---------- CSV ----------


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
    where = _older_than(*after) if after is not None else None
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
