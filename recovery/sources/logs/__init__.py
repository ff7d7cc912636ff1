"""Log stores a site already runs, read by job labels: Grafana Loki and VictoriaLogs.

``SOURCES`` registers the connectors by kind; ``build_source`` makes one, and
``source_from_settings`` makes the one a cluster's settings name. ``LogSource.fetch`` returns a
job's lines in time order; ``LogSource.discover_labels`` lists label names and sample values for
the configurator; ``render`` turns records into the text the scanner reads. Feeding new lines
into the detectors, each line once, is the loop's (``recovery.loop.log_stores``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from recovery.sources.http import ErrorKind
from recovery.sources.logs.base import Discovery, LogRecord, LogSource
from recovery.sources.logs.http import HttpSettings, LogSourceError
from recovery.sources.logs.loki import LokiSource
from recovery.sources.logs.mapping import LabelMapping, MappingError, suggest_mapping
from recovery.sources.logs.victorialogs import VictoriaLogsSource

SOURCES: dict[str, type[LogSource]] = {
    LokiSource.kind: LokiSource,
    VictoriaLogsSource.kind: VictoriaLogsSource,
}


def build_source(
    kind: str,
    url: str,
    mapping: LabelMapping | Mapping[str, Any],
    *,
    timeout: float = 10.0,
    bearer_token: str = "",
    username: str = "",
    password: str = "",
    tenant: str = "",
    headers: Mapping[str, str] | None = None,
    page_size: int = 1000,
) -> LogSource:
    """A connector of ``kind`` ("loki" or "victorialogs") at ``url``.

    ``tenant`` is Loki's ``X-Scope-OrgID``; for VictoriaLogs pass ``AccountID``/``ProjectID``
    in ``headers``. Raises ``ValueError`` (``MappingError`` for the mapping) with a message
    fit to show.
    """
    if kind not in SOURCES:
        raise ValueError(f"unknown log source {kind!r}: choose one of {', '.join(SOURCES)}")
    extra = dict(headers or {})
    if tenant:
        extra["X-Scope-OrgID"] = tenant
    http = HttpSettings(
        base_url=url,
        timeout=timeout,
        bearer_token=bearer_token,
        username=username,
        password=password,
        headers=extra,
    )
    if not isinstance(mapping, LabelMapping):
        mapping = LabelMapping.from_dict(mapping)
    return SOURCES[kind](http, mapping, page_size=page_size)


def source_from_settings(saved: object) -> LogSource | None:
    """The connector a cluster's ``log_source`` settings name (as ``configure_signals`` saves
    them: kind, url, mapping and ``build_source``'s options), or None when they name none.

    Raises ``LogSourceError``, ``ValueError`` or ``TypeError`` when the settings are unusable.
    """
    if not isinstance(saved, dict) or not saved.get("kind"):
        return None
    options = {k: v for k, v in saved.items() if k not in ("kind", "url", "mapping")}
    return build_source(
        saved["kind"], str(saved.get("url", "")), saved.get("mapping") or {}, **options
    )


__all__ = [
    "SOURCES",
    "Discovery",
    "ErrorKind",
    "HttpSettings",
    "LabelMapping",
    "LogRecord",
    "LogSource",
    "LogSourceError",
    "LokiSource",
    "MappingError",
    "VictoriaLogsSource",
    "build_source",
    "source_from_settings",
    "suggest_mapping",
]
