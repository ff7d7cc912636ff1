"""How the Console shows audit events and writes trail filters back into links and forms."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from recovery.audit.trail import AuditFilters


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


def datetime_local(value: datetime) -> str:
    """The value of a datetime-local input for an instant, in UTC; seconds only when needed."""
    value = value.astimezone(UTC)
    if value.second or value.microsecond:
        return value.strftime("%Y-%m-%dT%H:%M:%S")
    return value.strftime("%Y-%m-%dT%H:%M")


def trail_query_params(filters: AuditFilters) -> list[tuple[str, str]]:
    """The filters as the audit page's query parameters, for links that must show the same
    events (a quick range stays relative: it is linked by its key, not its start)."""
    params: list[tuple[str, str]] = []
    if filters.cluster:
        params.append(("cluster", filters.cluster))
    if filters.workload:
        params.append(("workload", str(filters.workload)))
    params.extend(("kind", kind) for kind in filters.kinds)
    if filters.actor:
        params.append(("actor", filters.actor))
    if filters.quick_range:
        params.append(("range", filters.quick_range))
    else:
        if filters.since:
            params.append(("from", datetime_local(filters.since)))
        if filters.until:
            params.append(("to", datetime_local(filters.until)))
    return params
