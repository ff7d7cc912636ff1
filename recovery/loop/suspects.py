"""Suspect nodes: one node behind the failures of several workloads.

A node implicated, by evidence the cluster's policy excludes on (hardware, interconnect), in
failures of several different workloads within that policy's window is probably broken,
whatever each job's own restart did. Recovery does not drain it: it flags the node for the
health layer (the Console shows the flag, the trail records it once) and keeps excluding it
from restarts. The policy is the cluster's (``site_policy_for``): an environment a job names
in its comment never sets how few workloads, how long a window or what evidence make a node
suspect for everyone.

Only site facts count (``EvidenceTrust.SITE``: the scheduler's states, a node's kernel log,
GPU metrics). What jobs print or push is their users' to write: a user with several jobs could
otherwise print the same Xid line in each and have a healthy node blamed cluster-wide. Such
evidence still excludes nodes from its own job's next attempt.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction

from recovery.audit.actors import Actor
from recovery.audit.record import record_event
from recovery.choices import AuditKind, EvidenceTrust
from recovery.loop.policy import site_policy_for
from recovery.loop.policy_rules import excludes_nodes, excluding_nodes
from recovery.models import Anomaly, Node


def flag_suspect_nodes(anomaly: Anomaly, now: datetime) -> list[Node]:
    """Flag the nodes ``anomaly`` implicates that are now implicated in enough workloads."""
    if not anomaly.implicated_nodes:
        return []
    workload = anomaly.workload
    cluster = workload.cluster
    # The cluster's policy: the job's own environment never says what makes a node suspect.
    policy = site_policy_for(workload)
    if anomaly.evidence_trust != EvidenceTrust.SITE or not excludes_nodes(anomaly, policy):
        return []
    since = now - timedelta(hours=policy.suspect_window_hours)
    # One query, filtered by the database: the node lists of the window's excluding anomalies.
    workloads_of: dict[str, set[int]] = {}
    wanted = set(anomaly.implicated_nodes)
    recent = (
        Anomaly.objects.filter(
            workload__cluster=cluster, detected_at__gte=since, evidence_trust=EvidenceTrust.SITE
        )
        .filter(excluding_nodes(policy))
        .values_list("workload_id", "implicated_nodes")
    )
    for workload_id, nodes in recent:
        for name in wanted.intersection(nodes or []):
            workloads_of.setdefault(name, set()).add(workload_id)
    flagged = []
    for name in anomaly.implicated_nodes:
        workloads = workloads_of.get(name, set())
        if len(workloads) < policy.suspect_node_workloads:
            continue
        with transaction.atomic():
            node = Node.objects.select_for_update().filter(cluster=cluster, name=name).first()
            if node is None or node.suspect_since is not None:
                continue
            node.suspect_since = now
            node.suspect_reason = (
                f"implicated in {len(workloads)} workloads within "
                f"{policy.suspect_window_hours} h (latest: {anomaly.category or anomaly.kind}, "
                f"{anomaly.attribution})"
            )[:255]
            node.save(update_fields=["suspect_since", "suspect_reason", "updated_at"])
            record_event(
                cluster=cluster,
                workload=workload,
                attempt=anomaly.attempt.number if anomaly.attempt else None,
                kind=AuditKind.NODE_SUSPECT,
                actor=Actor.POLICY,
                payload={
                    "node": name,
                    "workloads": sorted(workloads),
                    "window_hours": policy.suspect_window_hours,
                    "reason": node.suspect_reason,
                    "recommendation": "drain and test the node; recovery does not drain it",
                },
            )
        flagged.append(node)
    return flagged
