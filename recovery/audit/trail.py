"""Reading the audit trail: the filters' query, keyset pages and an event's neighbours.

The Console's audit views and the API call these plain functions with ``AuditFilters`` (made
from query parameters by ``recovery.read.filters``); nothing here knows about HTTP. The CSV
export is ``recovery.audit.export``. The table holds millions of rows, so every query here:

- reads the audit table alone (names are resolved to ids first) and orders by
  ``(occurred_at, id)``, which the indexes ``(cluster|workload|kind|actor, occurred_at)`` serve
  directly: InnoDB appends the primary key to every secondary index, so the ``id`` tie-break
  needs no sort. On MySQL/MariaDB the query names those indexes (see ``fetch_events``);
- pages with a keyset cursor instead of OFFSET, and never counts the matching rows;
- can be read in bounded keyset batches (``older_than``), as the CSV export does.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Literal

from django.core.exceptions import EmptyResultSet
from django.db import connections
from django.db.models import Prefetch, Q, QuerySet, prefetch_related_objects

from recovery.models import AuditEvent, Cluster, Workload

PAGE_SIZE = 100
NEIGHBOUR_COUNT = 5
# "cluster:job id" may name several workloads (Slurm reuses job ids); read at most this many.
_MAX_REUSED_JOB_IDS = 100

# Quick ranges are relative, so a live first page keeps showing "the last hour" as time passes.
QUICK_RANGES: dict[str, tuple[str, timedelta]] = {
    "1h": ("Last hour", timedelta(hours=1)),
    "24h": ("Last 24 hours", timedelta(hours=24)),
    "7d": ("Last 7 days", timedelta(days=7)),
}

MAX_ID = 2**63 - 1  # BIGINT: a larger number cannot be an id, and MariaDB would reject it
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
    """Valid filters only: whatever failed to parse is already left out.

    ``quick_range`` names the relative range (a key of ``QUICK_RANGES``) that ``since`` was
    computed from, so links can ask for the same range again."""

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

    def with_quick_range(self, key: str) -> AuditFilters:
        """These filters over one of ``QUICK_RANGES`` (or any time for ``""``) instead."""
        return replace(self, quick_range=key, since=None, until=None)


# ---------- the query ----------


@dataclass(frozen=True)
class Selection:
    """The events some filters select: a query on the audit table alone, and the indexes that
    can serve it in (occurred_at, id) order."""

    events: QuerySet[AuditEvent]
    indexes: tuple[str, ...] = ()


def _index_named(*fields: str) -> str:
    return next(
        str(index.name) for index in AuditEvent._meta.indexes if tuple(index.fields) == fields
    )


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


def older_than(occurred_at: datetime, event_id: int) -> Q:
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
    if not 0 < int(event_id) <= MAX_ID:
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
            selection, where=older_than(cursor.occurred_at, cursor.event_id), limit=size + 1
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
    if not 0 < event_id <= MAX_ID:
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
    before = fetch_events(nearby, where=older_than(event.occurred_at, event.pk), limit=count)
    after = fetch_events(
        nearby, where=_newer_than(event.occurred_at, event.pk), order=OLDEST_FIRST, limit=count
    )
    return Neighbourhood(before=before[::-1], after=after, scope=scope)
