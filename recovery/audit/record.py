"""Writing to the audit trail."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import connection, transaction

from recovery.audit import live
from recovery.models import AuditEvent, Cluster, Workload


def record_event(
    *,
    cluster: Cluster,
    kind: str,
    actor: str,
    workload: Workload | None = None,
    attempt: int | None = None,
    payload: dict[str, Any] | None = None,
    occurred_at: datetime | None = None,
) -> AuditEvent:
    """Append one event and announce it to live Console views once the transaction commits."""
    fields: dict[str, Any] = {
        "cluster": cluster,
        "workload": workload,
        "attempt": attempt,
        "kind": kind,
        "actor": actor,
        "payload": payload or {},
    }
    if occurred_at is not None:
        fields["occurred_at"] = occurred_at
    event = AuditEvent.objects.create(**fields)
    transaction.on_commit(lambda: live.announce_event(event))
    return event


def record_events(events: list[AuditEvent]) -> list[AuditEvent]:
    """Append unsaved events in one statement; announced to live views once committed.

    Where the database cannot say which ids a multi-row insert gave (MySQL proper), each is
    inserted on its own: an announcement names its event.
    """
    if not events:
        return []
    if connection.features.can_return_rows_from_bulk_insert:
        AuditEvent.objects.bulk_create(events)
    else:
        for event in events:
            event.save()
    saved = list(events)
    transaction.on_commit(lambda: live.announce_events(saved))
    return saved
