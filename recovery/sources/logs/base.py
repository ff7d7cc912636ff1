"""What every log store connector provides: time-ordered records of one job, and discovery.

A connector reads pages forward in time. Each page restarts at the last timestamp it saw
(inclusive) and drops what it already returned, so lines sharing a timestamp across a page
boundary are neither lost nor repeated. ``fetch`` stops at ``limit`` lines or ``max_bytes`` and
then returns only whole timestamps: every line at or before the last returned timestamp has
been returned, so the caller resumes at that timestamp + 1 ns.
"""

from __future__ import annotations

import abc
import logging
import re
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from recovery.sources.logs.http import HttpSettings
from recovery.sources.logs.mapping import LabelMapping, check_selector_value

logger = logging.getLogger(__name__)

NS_PER_SECOND = 1_000_000_000
DEFAULT_PAGE_SIZE = 1000
DEFAULT_MAX_LINES = 20_000
DEFAULT_MAX_BYTES = 8 * 1024 * 1024
MAX_LINE_CHARS = 16 * 1024
MAX_DISCOVERED_NAMES = 50
MAX_DISCOVERED_VALUES = 5
TRUNCATION_MARK = " …[line truncated]"


@dataclass(frozen=True)
class LogRecord:
    """One log line with where it came from (``node``/``rank`` per the label mapping)."""

    timestamp_ns: int
    line: str
    node: str | None = None
    rank: int | None = None
    labels: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)

    @property
    def at(self) -> datetime:
        return datetime.fromtimestamp(self.timestamp_ns / NS_PER_SECOND, tz=UTC)


@dataclass(frozen=True)
class Discovery:
    """Label (field) names a store holds and a few values of each, for the configurator."""

    labels: dict[str, list[str]]
    suggested: dict[str, str]


@dataclass(frozen=True)
class RawEntry:
    """A line as the store returned it, before the mapping is applied."""

    timestamp_ns: int
    line: str
    labels: Mapping[str, str]
    stream: str  # the store's own identity of the stream, for de-duplication

    def key(self) -> Hashable:
        return (self.timestamp_ns, self.stream, self.line)


def to_ns(moment: datetime | int) -> int:
    if isinstance(moment, int):
        return moment
    if moment.tzinfo is None:
        raise ValueError("naive datetime: give an aware one (UTC)")
    seconds = int(moment.timestamp())
    return seconds * NS_PER_SECOND + moment.microsecond * 1000


def clean_line(raw: object) -> str:
    """A printable, bounded line from whatever the store sent (bytes, odd types, NULs)."""
    if isinstance(raw, bytes):
        text = raw.decode("utf-8", errors="replace")
    elif isinstance(raw, str):
        text = raw
    else:
        text = "" if raw is None else str(raw)
    # Lone surrogates (from JSON \ud800 escapes) cannot be encoded later; replace them now.
    text = text.encode("utf-8", errors="replace").decode("utf-8")
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    if len(text) > MAX_LINE_CHARS:
        text = text[:MAX_LINE_CHARS] + TRUNCATION_MARK
    return text


class LogSource(abc.ABC):
    """A log store queried by job id through a ``LabelMapping``."""

    kind: str = ""
    service: str = ""
    # The largest page asked for when many lines share one timestamp.
    max_page_size: int = 5000

    def __init__(
        self,
        http: HttpSettings,
        mapping: LabelMapping,
        *,
        page_size: int = DEFAULT_PAGE_SIZE,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        if not 1 <= page_size <= 5000:
            raise ValueError("page_size must be between 1 and 5000")
        self.http = http
        self.mapping = mapping
        self.page_size = page_size
        self.max_bytes = max_bytes
        self.validate_mapping()

    @abc.abstractmethod
    def validate_mapping(self) -> None: ...

    @abc.abstractmethod
    def query_for(self, job_id: str) -> str:
        """The store's query selecting ``job_id``'s lines (escaped, ready to send)."""

    @abc.abstractmethod
    def _page(self, query: str, start_ns: int, end_ns: int, limit: int) -> list[RawEntry]:
        """Up to ``limit`` entries in ``[start_ns, end_ns)``, oldest first."""

    @abc.abstractmethod
    def discover_labels(self, *, since: datetime | None = None) -> Discovery: ...

    def cursor_key(self, job_id: str) -> str:
        """Names this job's read position among a workload's cursors."""
        return f"{self.kind}:{self.query_for(job_id)}"[:1024]

    def fetch(
        self,
        job_id: str,
        since: datetime | int,
        until: datetime | int,
        *,
        limit: int = DEFAULT_MAX_LINES,
    ) -> list[LogRecord]:
        """``job_id``'s lines in ``[since, until)``, oldest first, each once (see module doc)."""
        check_selector_value(job_id, "the job id")
        query = self.query_for(job_id)
        start, end = to_ns(since), to_ns(until)
        entries: list[RawEntry] = []
        size = 0
        boundary_ts = -1
        seen: set[Hashable] = set()
        capped = False
        page_limit = self.page_size
        while start < end and not capped:
            page = self._page(query, start, end, page_limit)
            fresh = [e for e in page if e.timestamp_ns > boundary_ts or e.key() not in seen]
            for entry in fresh:
                if len(entries) >= limit or size >= self.max_bytes:
                    capped = True
                    break
                entries.append(entry)
                size += len(entry.line)
            if len(page) < page_limit:
                break  # the store has nothing more in the range
            last = page[-1].timestamp_ns
            if last != boundary_ts:
                boundary_ts, seen = last, set()
            seen.update(e.key() for e in page if e.timestamp_ns == last)
            if fresh:
                start, page_limit = last, self.page_size
            elif page_limit < self.max_page_size:
                # A full page of one instant, all seen: more lines share it than a page holds.
                # Ask again for a larger page rather than skip past them.
                page_limit = min(page_limit * 2, self.max_page_size)
            else:
                logger.warning(
                    "%s: more than %d lines at %d ns for %s; skipping past that instant",
                    self.service,
                    page_limit,
                    last,
                    query,
                )
                start, page_limit = last + 1, self.page_size
        if capped:
            entries = _whole_timestamps(entries)
        return [self._record(entry) for entry in entries]

    def _record(self, entry: RawEntry) -> LogRecord:
        return LogRecord(
            timestamp_ns=entry.timestamp_ns,
            line=entry.line,
            node=self.mapping.node_of(entry.labels),
            rank=self.mapping.rank_of(entry.labels),
            labels=entry.labels,
        )


def _whole_timestamps(entries: list[RawEntry]) -> list[RawEntry]:
    """Drop the trailing lines at the last timestamp, unless that would drop everything."""
    if not entries:
        return entries
    last = entries[-1].timestamp_ns
    kept = [e for e in entries if e.timestamp_ns != last]
    return kept or entries


def merge_sorted(entries: list[RawEntry]) -> list[RawEntry]:
    """Entries of several streams in time order; ties keep a stable, repeatable order."""
    return sorted(entries, key=lambda e: (e.timestamp_ns, e.stream))


# Node names the scanner's ``host: `` prefix recognises (a digit, no capitals).
SCANNER_NODE = re.compile(r"[a-z0-9][a-z0-9.-]*\d[a-z0-9.-]*")


def render(records: list[LogRecord]) -> tuple[bytes, list[LogRecord]]:
    """The records as log text the scanner reads, and the record behind each text line.

    Each line gets prefixes the scanner already peels: its time (so findings and progress carry
    the store's timestamp), its node when the name has the shape the scanner recognises, and
    its rank. A record holding several lines (a traceback shipped as one entry) is split, each
    piece with the same prefixes.
    """
    lines: list[str] = []
    owners: list[LogRecord] = []
    for record in records:
        prefix = record.at.isoformat().replace("+00:00", "Z") + " "
        if record.node and SCANNER_NODE.fullmatch(record.node):
            prefix += f"{record.node}: "
        if record.rank is not None:
            prefix += f"[rank{record.rank}]: "
        for piece in record.line.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
            lines.append(prefix + piece)
            owners.append(record)
    return ("\n".join(lines) + "\n").encode("utf-8", errors="replace"), owners
