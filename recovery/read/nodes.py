"""A node's health as the Console shows it: one answer to "is it suspect?" for every page.

Two records say a node is suspect: ``Node.suspect_since``, set when it was implicated in the
failures of several workloads (``recovery.loop.suspects``), and ``Node.health``, which the
health layer or an administrator may set to Suspect. Pages read both through ``standing`` (one
node) or ``SUSPECT`` (a query condition), so a health of Suspect and an empty Suspect column
can never appear side by side.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Q

from recovery.choices import NodeHealth
from recovery.models import Node

__all__ = ("SUSPECT", "NodeStanding", "is_suspect", "standing")

# The nodes either record calls suspect, as a query condition.
SUSPECT = Q(suspect_since__isnull=False) | Q(health=NodeHealth.SUSPECT)

_HEALTH_LABELS = dict(NodeHealth.choices)
HEALTH_SAYS_SUSPECT = "its health is Suspect"


@dataclass(frozen=True)
class NodeStanding:
    """What the Console says of a node's health: the health shown, and whether, since when
    and why it is suspect."""

    health: str
    suspect: bool
    suspect_since: datetime | None
    suspect_reason: str

    @property
    def health_label(self) -> str:
        return str(_HEALTH_LABELS.get(self.health, self.health))


def is_suspect(suspect_since: datetime | None, health: str) -> bool:
    return suspect_since is not None or health == NodeHealth.SUSPECT


def standing(node: Node) -> NodeStanding:
    """The node's health as shown: Unhealthy wins; a node either record calls suspect is
    Suspect, with the reason recovery recorded or, when only its health says so, that."""
    suspect = is_suspect(node.suspect_since, node.health)
    if node.health == NodeHealth.UNHEALTHY:
        health = NodeHealth.UNHEALTHY.value
    elif suspect:
        health = NodeHealth.SUSPECT.value
    else:
        health = node.health
    reason = node.suspect_reason
    if suspect and not reason:
        reason = HEALTH_SAYS_SUSPECT if node.health == NodeHealth.SUSPECT else ""
    return NodeStanding(health, suspect, node.suspect_since, reason)
