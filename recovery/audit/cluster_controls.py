"""Audit events for what a cluster may do on its own: its mode, its acknowledgement of
scheduler actions (``Cluster.acts_automatically`` needs action mode and the acknowledgement) and
whether it drains nodes without an approval.

A person's change of any is one event each, ``mode_changed``, ``acknowledgement_changed`` or
``automatic_drain_changed``, with the value before and after; a save that changes none records
nothing. The value before is read from the stored row under a lock, not from the form that was
shown, so two people saving at once each record what they actually changed. A new cluster counts
as changed from the values a new cluster starts with.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django.db import transaction

from recovery.audit.record import record_event
from recovery.choices import AuditKind
from recovery.models import AuditEvent, Cluster


@dataclass(frozen=True)
class ClusterControls:
    mode: str
    acknowledge_scheduler_actions: bool
    drain_automatically: bool = False

    @classmethod
    def of(cls, cluster: Cluster) -> ClusterControls:
        return cls(
            str(cluster.mode),
            bool(cluster.acknowledge_scheduler_actions),
            bool(cluster.drain_automatically),
        )


def new_cluster_controls() -> ClusterControls:
    """The values a cluster starts with when nobody sets them."""
    return ClusterControls.of(Cluster())


def stored_controls(cluster_pk: int | None) -> ClusterControls:
    """The controls as stored, the row locked until the transaction ends; a new cluster's
    defaults when nothing is stored yet."""
    if cluster_pk is None:
        return new_cluster_controls()
    row = (
        Cluster.objects.select_for_update()
        .filter(pk=cluster_pk)
        .values_list("mode", "acknowledge_scheduler_actions", "drain_automatically")
        .first()
    )
    if row is None:
        return new_cluster_controls()
    return ClusterControls(str(row[0]), bool(row[1]), bool(row[2]))


# Each control, the event a change of it records.
CONTROL_EVENTS = (
    ("mode", AuditKind.MODE_CHANGED),
    ("acknowledge_scheduler_actions", AuditKind.ACKNOWLEDGEMENT_CHANGED),
    ("drain_automatically", AuditKind.AUTOMATIC_DRAIN_CHANGED),
)


def record_control_changes(
    cluster: Cluster, before: ClusterControls, actor: str
) -> list[AuditEvent]:
    """One event per control whose saved value differs from ``before``."""
    after = ClusterControls.of(cluster)
    events = []
    for control, kind in CONTROL_EVENTS:
        was, now = getattr(before, control), getattr(after, control)
        if was == now:
            continue
        # The three kinds share one payload shape (recovery.audit.payloads).
        change = {"from": was, "to": now}
        events.append(record_event(cluster=cluster, kind=kind, actor=actor, payload=change))
    return events


def save_with_audit(cluster: Cluster, actor: str, save: Callable[[], None]) -> list[AuditEvent]:
    """Run ``save`` (which stores ``cluster``) and record the changes of its controls, in one
    transaction."""
    with transaction.atomic():
        before = stored_controls(cluster.pk)
        save()
        return record_control_changes(cluster, before, actor)
