"""Audit events for what a cluster may do on its own: its mode, its acknowledgement of
scheduler actions (``Cluster.acts_automatically`` needs action mode and the acknowledgement),
whether it drains nodes without an approval, and the canary (the partitions and share of jobs
action mode reaches).

A person's change of any is one event each, ``mode_changed``, ``acknowledgement_changed``,
``automatic_drain_changed`` or ``action_scope_changed``, with the value before and after and the
person's reason where one was asked; a save that changes none records
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
    # The canary: the part of the cluster action mode reaches (``Cluster.in_action_scope``).
    action_partitions: tuple[str, ...] = ()
    action_share_percent: int = 100

    @classmethod
    def of(cls, cluster: Cluster) -> ClusterControls:
        return cls(
            str(cluster.mode),
            bool(cluster.acknowledge_scheduler_actions),
            bool(cluster.drain_automatically),
            tuple(str(p) for p in cluster.action_partitions or []),
            int(cluster.action_share_percent),
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
        .values_list(
            "mode",
            "acknowledge_scheduler_actions",
            "drain_automatically",
            "action_partitions",
            "action_share_percent",
        )
        .first()
    )
    if row is None:
        return new_cluster_controls()
    return ClusterControls(
        str(row[0]),
        bool(row[1]),
        bool(row[2]),
        tuple(str(p) for p in row[3] or []),
        int(row[4]),
    )


# Each control, the event a change of it records.
CONTROL_EVENTS = (
    ("mode", AuditKind.MODE_CHANGED),
    ("acknowledge_scheduler_actions", AuditKind.ACKNOWLEDGEMENT_CHANGED),
    ("drain_automatically", AuditKind.AUTOMATIC_DRAIN_CHANGED),
    ("action_partitions", AuditKind.ACTION_SCOPE_CHANGED),
    ("action_share_percent", AuditKind.ACTION_SCOPE_CHANGED),
)


def record_control_changes(
    cluster: Cluster, before: ClusterControls, actor: str, reason: str = ""
) -> list[AuditEvent]:
    """One event per control whose saved value differs from ``before`` (the canary's two
    settings are one ``action_scope_changed`` event), each with the person's reason if given."""
    after = ClusterControls.of(cluster)
    events = []
    scope_recorded = False
    for control, kind in CONTROL_EVENTS:
        was, now = getattr(before, control), getattr(after, control)
        if was == now:
            continue
        if kind == AuditKind.ACTION_SCOPE_CHANGED:
            if scope_recorded:
                continue
            scope_recorded = True
            change: dict[str, object] = {
                "from": _scope(before),
                "to": _scope(after),
            }
        else:
            # These kinds share one payload shape (recovery.audit.payloads).
            change = {"from": was, "to": now}
        if reason:
            change["reason"] = reason
        events.append(record_event(cluster=cluster, kind=kind, actor=actor, payload=change))
    return events


def _scope(controls: ClusterControls) -> dict[str, object]:
    return {
        "partitions": list(controls.action_partitions),
        "share_percent": controls.action_share_percent,
    }


def save_with_audit(
    cluster: Cluster, actor: str, save: Callable[[], None], reason: str = ""
) -> list[AuditEvent]:
    """Run ``save`` (which stores ``cluster``) and record the changes of its controls, in one
    transaction."""
    with transaction.atomic():
        before = stored_controls(cluster.pk)
        save()
        return record_control_changes(cluster, before, actor, reason)
