"""An operator returns a node to service: recovery stops keeping it out of restarts.

Unhealthy, excluded and suspect nodes are kept out of every job's restart
(``recovery.loop.policy.kept_out_of_every_job``) until their exclusion time runs out; a node
repaired sooner is returned by a person, never by the loop, and the trail says who did it.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction

from recovery.audit.record import record_event
from recovery.choices import AuditKind, NodeHealth
from recovery.models import Node


@dataclass(frozen=True)
class Returned:
    node: Node
    changed: bool
    message: str


def return_to_service(node_id: int, *, operator: str, note: str = "") -> Returned:
    """Clear what keeps ``node_id`` out of restarts; doing it again changes nothing."""
    note = note.strip()[:2000]
    with transaction.atomic():
        node = Node.objects.select_for_update().select_related("cluster").get(pk=node_id)
        before = {
            "health": node.health,
            "excluded_until": node.excluded_until.isoformat() if node.excluded_until else None,
            "suspect_since": node.suspect_since.isoformat() if node.suspect_since else None,
        }
        kept_out = (
            node.health in (NodeHealth.UNHEALTHY, NodeHealth.SUSPECT)
            or node.excluded_until is not None
            or node.suspect_since is not None
        )
        if not kept_out:
            return Returned(node, False, f"{node.name} is not kept out of restarts.")
        node.health = NodeHealth.HEALTHY
        node.excluded_until = None
        node.suspect_since = None
        node.suspect_reason = ""
        node.save(
            update_fields=[
                "health",
                "excluded_until",
                "suspect_since",
                "suspect_reason",
                "updated_at",
            ]
        )
        record_event(
            cluster=node.cluster,
            kind=AuditKind.NODE_RETURNED,
            actor=operator,
            payload={"node": node.name, "before": before, "note": note},
        )
    return Returned(node, True, f"{node.name} is back in service for recovery.")
