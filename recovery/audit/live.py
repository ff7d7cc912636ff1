"""The one publisher of live updates to the Console.

Payloads are small typed dicts; consumers fetch or render whatever they show from them.
Publishing never raises into the caller: a Console that is briefly not listening must not
make a scheduler action or a detection fail.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING, Literal, TypedDict

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

if TYPE_CHECKING:
    from recovery.models import AuditEvent

logger = logging.getLogger(__name__)

FLEET_GROUP = "fleet"


def workload_group(workload_id: int) -> str:
    return f"workload.{workload_id}"


class AuditEventMessage(TypedDict):
    type: Literal["audit.event"]
    event_id: int
    cluster: str
    workload_id: int | None
    kind: str
    actor: str
    occurred_at: str


class SnapshotMessage(TypedDict):
    type: Literal["insights.snapshot"]
    taken_at: str
    clusters: int


def announce_event(event: AuditEvent) -> None:
    message: AuditEventMessage = {
        "type": "audit.event",
        "event_id": event.pk,
        "cluster": event.cluster.name,
        "workload_id": event.workload_id,
        "kind": event.kind,
        "actor": event.actor,
        "occurred_at": event.occurred_at.isoformat(),
    }
    groups = [FLEET_GROUP]
    if event.workload_id is not None:
        groups.append(workload_group(event.workload_id))
    publish(groups, message)


def announce_snapshots(taken_at: datetime, clusters: int) -> None:
    """New goodput figures: pages that show them (fleet, insights) fetch themselves again."""
    message: SnapshotMessage = {
        "type": "insights.snapshot",
        "taken_at": taken_at.isoformat(),
        "clusters": clusters,
    }
    publish([FLEET_GROUP], message)


def publish(groups: list[str], message: AuditEventMessage | SnapshotMessage) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        for group in groups:
            # Channels' stubs ask for a dict where any mapping does; a TypedDict is a dict.
            async_to_sync(layer.group_send)(group, message)  # type: ignore[arg-type]
    except Exception:
        logger.warning("live update not delivered: %s", message["type"], exc_info=True)
