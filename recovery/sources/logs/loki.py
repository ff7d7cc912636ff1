"""Grafana Loki: ``/loki/api/v1/query_range`` by job labels, ``labels`` for discovery.

A job's lines are selected by a stream selector built from the mapping,
``{slurm_job_id="4242",cluster="a100"}``; every value is quoted with Go escaping.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from urllib.parse import quote

from django.utils import timezone

from recovery.sources.logs.base import (
    MAX_DISCOVERED_NAMES,
    MAX_DISCOVERED_VALUES,
    Discovery,
    LogSource,
    RawEntry,
    clean_line,
    merge_sorted,
    to_ns,
)
from recovery.sources.logs.http import get_json, malformed
from recovery.sources.logs.mapping import logql_string, suggest_mapping

QUERY_RANGE = "/loki/api/v1/query_range"
LABELS = "/loki/api/v1/labels"
LABEL_VALUES = "/loki/api/v1/label/{name}/values"
DISCOVERY_WINDOW = timedelta(hours=6)
# Loki's own internal label, present on every stream; never a mapping candidate.
INTERNAL_LABELS = frozenset({"__name__", "__stream_shard__"})


class LokiSource(LogSource):
    kind = "loki"
    service = "Loki"

    def validate_mapping(self) -> None:
        self.mapping.validate_for_loki()

    def query_for(self, job_id: str) -> str:
        matchers = {self.mapping.job: job_id, **self.mapping.static_selectors}
        inner = ",".join(f"{name}={logql_string(value)}" for name, value in matchers.items())
        return "{" + inner + "}"

    def _page(self, query: str, start_ns: int, end_ns: int, limit: int) -> list[RawEntry]:
        params: dict[str, str | int] = {
            "query": query,
            "start": str(start_ns),
            "end": str(end_ns),
            "limit": limit,
            "direction": "forward",
        }
        body = get_json(self.http, QUERY_RANGE, params, self.service)
        data = self._data(body, QUERY_RANGE)
        if not isinstance(data, dict) or not isinstance(data.get("result"), list):
            raise malformed(self.http, QUERY_RANGE, "no data.result list", self.service)
        if data.get("resultType", "streams") != "streams":
            raise malformed(
                self.http, QUERY_RANGE, f"resultType {data.get('resultType')!r}", self.service
            )
        entries: list[RawEntry] = []
        for stream in data["result"]:
            labels = stream.get("stream") if isinstance(stream, dict) else None
            values = stream.get("values") if isinstance(stream, dict) else None
            if not isinstance(labels, dict) or not isinstance(values, list):
                raise malformed(self.http, QUERY_RANGE, "a stream without labels", self.service)
            labels = {str(k): str(v) for k, v in labels.items()}
            identity = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
            for value in values:
                if not isinstance(value, list) or len(value) < 2:
                    raise malformed(self.http, QUERY_RANGE, "a value is not a pair", self.service)
                timestamp = str(value[0])
                if not timestamp.isdigit():
                    raise malformed(
                        self.http, QUERY_RANGE, f"timestamp {timestamp[:30]!r}", self.service
                    )
                entries.append(RawEntry(int(timestamp), clean_line(value[1]), labels, identity))
        return merge_sorted(entries)[:limit]

    def discover_labels(self, *, since: datetime | None = None) -> Discovery:
        now = timezone.now()
        window = {"start": str(to_ns(since or now - DISCOVERY_WINDOW)), "end": str(to_ns(now))}
        names = self._string_list(get_json(self.http, LABELS, window, self.service), LABELS)
        names = [n for n in names if n not in INTERNAL_LABELS][:MAX_DISCOVERED_NAMES]
        labels: dict[str, list[str]] = {}
        for name in names:
            path = LABEL_VALUES.format(name=quote(name, safe=""))
            values = self._string_list(get_json(self.http, path, window, self.service), path)
            labels[name] = values[:MAX_DISCOVERED_VALUES]
        return Discovery(labels=labels, suggested=suggest_mapping(labels))

    def _data(self, body: object, path: str) -> object:
        if not isinstance(body, dict) or body.get("status") != "success" or "data" not in body:
            raise malformed(self.http, path, 'no "status": "success" with data', self.service)
        return body["data"]

    def _string_list(self, body: object, path: str) -> list[str]:
        data = self._data(body, path)
        if data is None:
            return []  # Loki answers null when the window holds no streams
        if not isinstance(data, list):
            raise malformed(self.http, path, "data is not a list", self.service)
        return [clean_line(item)[:256] for item in data if isinstance(item, str)]
