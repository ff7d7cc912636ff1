"""VictoriaLogs: ``/select/logsql/query`` (JSON lines), ``field_names`` / ``field_values``.

A job's lines are selected with exact-match filters built from the mapping and a ``_time``
range, sorted and limited by pipes:
``"slurm_job_id":="4242" "cluster":="a100" _time:[<start>, <end>) | sort by (_time) | limit 1000``.
Field names and values are always quoted, so a value can't end the filter and start a pipe.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

from django.utils import timezone

from recovery.sources.http import ErrorKind
from recovery.sources.logs.base import (
    MAX_DISCOVERED_NAMES,
    MAX_DISCOVERED_VALUES,
    NS_PER_SECOND,
    Discovery,
    LogSource,
    RawEntry,
    clean_line,
    merge_sorted,
    to_ns,
)
from recovery.sources.logs.http import LogSourceError, get, get_json, malformed
from recovery.sources.logs.mapping import logsql_string, suggest_mapping

QUERY = "/select/logsql/query"
FIELD_NAMES = "/select/logsql/field_names"
FIELD_VALUES = "/select/logsql/field_values"
DISCOVERY_WINDOW = timedelta(hours=6)
# VictoriaLogs' own fields: the message, its time and stream identity.
INTERNAL_FIELDS = frozenset({"_msg", "_time", "_stream", "_stream_id"})
RFC3339 = re.compile(
    r"(\d{4}-\d{2}-\d{2})[T ](\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?(Z|[+-]\d{2}:\d{2})"
)
STREAM_PAIR = re.compile(r'([^{},=\s]+)="((?:[^"\\]|\\.)*)"')


class VictoriaLogsSource(LogSource):
    kind = "victorialogs"
    service = "VictoriaLogs"

    def validate_mapping(self) -> None:
        self.mapping.validate_for_logsql()

    def query_for(self, job_id: str) -> str:
        matchers = {self.mapping.job: job_id, **self.mapping.static_selectors}
        return " ".join(
            f"{logsql_string(name)}:={logsql_string(value)}" for name, value in matchers.items()
        )

    def _page(self, query: str, start_ns: int, end_ns: int, limit: int) -> list[RawEntry]:
        wanted = ["_time", "_msg", "_stream"]
        wanted += [n for n in (self.mapping.node, self.mapping.rank) if n]
        full = (
            f"{query} _time:[{format_ns(start_ns)}, {format_ns(end_ns)})"
            f" | sort by (_time) | limit {int(limit)}"
            f" | fields {', '.join(logsql_string(n) for n in dict.fromkeys(wanted))}"
        )
        body = get(self.http, QUERY, {"query": full}, self.service)
        entries = []
        for number, raw in enumerate(body.split(b"\n"), start=1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw.decode("utf-8", errors="replace"))
            except json.JSONDecodeError:
                raise LogSourceError(
                    ErrorKind.MALFORMED,
                    f"{self.http.base_url.rstrip('/')}{QUERY} line {number} is not JSON: "
                    f"is this {self.service}?",
                ) from None
            if not isinstance(row, dict) or "_time" not in row:
                raise malformed(self.http, QUERY, f"line {number} has no _time", self.service)
            timestamp = parse_rfc3339_ns(str(row["_time"]))
            if timestamp is None:
                raise malformed(self.http, QUERY, f"_time {str(row['_time'])[:40]!r}", self.service)
            stream = str(row.get("_stream", ""))
            labels = parse_stream(stream)
            labels.update({k: str(v) for k, v in row.items() if k not in INTERNAL_FIELDS})
            entries.append(RawEntry(timestamp, clean_line(row.get("_msg", "")), labels, stream))
        return merge_sorted(entries)[:limit]

    def discover_labels(self, *, since: datetime | None = None) -> Discovery:
        now = timezone.now()
        window = {
            "query": "*",
            "start": format_ns(to_ns(since or now - DISCOVERY_WINDOW)),
            "end": format_ns(to_ns(now)),
        }
        names = self._values(get_json(self.http, FIELD_NAMES, window, self.service), FIELD_NAMES)
        names = [n for n in names if n not in INTERNAL_FIELDS][:MAX_DISCOVERED_NAMES]
        labels: dict[str, list[str]] = {}
        for name in names:
            params: dict[str, str | int] = {**window, "field": name, "limit": MAX_DISCOVERED_VALUES}
            body = get_json(self.http, FIELD_VALUES, params, self.service)
            labels[name] = self._values(body, FIELD_VALUES)[:MAX_DISCOVERED_VALUES]
        return Discovery(labels=labels, suggested=suggest_mapping(labels))

    def _values(self, body: object, path: str) -> list[str]:
        values = body.get("values") if isinstance(body, dict) else None
        if not isinstance(values, list):
            raise malformed(self.http, path, 'no "values" list', self.service)
        found = []
        for item in values:
            value = item.get("value") if isinstance(item, dict) else None
            if isinstance(value, str):
                found.append(clean_line(value)[:256])
        return found


def format_ns(timestamp_ns: int) -> str:
    """RFC 3339 in UTC with nanoseconds, as LogsQL time filters accept."""
    seconds, fraction = divmod(timestamp_ns, NS_PER_SECOND)
    moment = datetime.fromtimestamp(seconds, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + f".{fraction:09d}Z"


def parse_rfc3339_ns(text: str) -> int | None:
    """Nanoseconds since the epoch of an RFC 3339 time, keeping all nine fraction digits."""
    found = RFC3339.fullmatch(text.strip())
    if found is None:
        return None
    day, clock, fraction, zone = found.groups()
    try:
        moment = datetime.fromisoformat(f"{day}T{clock}{'+00:00' if zone == 'Z' else zone}")
    except ValueError:
        return None
    nanos = int((fraction or "").ljust(9, "0"))
    return int(moment.timestamp()) * NS_PER_SECOND + nanos


def parse_stream(stream: str) -> dict[str, str]:
    """The fields of a ``_stream`` value such as ``{host="node-1",job="4242"}``."""
    labels = {}
    for name, value in STREAM_PAIR.findall(stream[:4096]):
        try:
            labels[name] = json.loads(f'"{value}"')
        except json.JSONDecodeError:
            labels[name] = value
    return labels
