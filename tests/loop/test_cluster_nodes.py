"""Nodes bad on the cluster are kept out of every job's restart, not only the job that saw them.

A node is kept out for every user only on facts users do not control: its kernel log, DCGM, the
scheduler's node state (``Node.health``, ``Node.excluded_until``). What one job printed keeps
a node out of that job's restart alone.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from recovery.choices import (
    AuditKind,
    ClusterMode,
    ClusterNodeState,
    NodeHealth,
    RecommendationAction,
    RecommendationStatus,
)
from recovery.loop.decision_facts import History
from recovery.loop.policy import kept_out_of_every_job, recommend
from recovery.loop.policy_rules import decide
from recovery.models import Anomaly, AuditEvent, Cluster, Node, Policy
from tests.factories import AnomalyFactory, ClusterFactory, WorkloadFactory

pytestmark = pytest.mark.django_db


def cluster_with_nodes(count: int = 10) -> tuple[Cluster, list[Node]]:
    cluster = ClusterFactory(mode=ClusterMode.ACTION, acknowledge_scheduler_actions=True)
    nodes = [Node.objects.create(cluster=cluster, name=f"gpu-{n:03d}") for n in range(1, count + 1)]
    return cluster, nodes


def test_which_states_keep_a_node_out_and_for_how_long() -> None:
    cluster, nodes = cluster_with_nodes()
    now = timezone.now()
    Node.objects.filter(pk=nodes[0].pk).update(excluded_until=now + timedelta(hours=1))
    Node.objects.filter(pk=nodes[1].pk).update(excluded_until=now - timedelta(minutes=1))
    Node.objects.filter(pk=nodes[2].pk).update(
        health=NodeHealth.UNHEALTHY, last_implicated_at=now - timedelta(hours=1)
    )
    Node.objects.filter(pk=nodes[3].pk).update(
        health=NodeHealth.UNHEALTHY, last_implicated_at=now - timedelta(hours=30)
    )
    Node.objects.filter(pk=nodes[4].pk).update(suspect_since=now)
    policy = Policy(exclusion_hours=24)

    assert kept_out_of_every_job(cluster.pk, policy) == {
        "gpu-001": ClusterNodeState.EXCLUDED,
        "gpu-003": ClusterNodeState.UNHEALTHY,
    }
    policy.keep_out_cluster_nodes = [ClusterNodeState.SUSPECT]
    assert kept_out_of_every_job(cluster.pk, policy) == {"gpu-005": "suspect"}
    policy.keep_out_cluster_nodes = []
    assert kept_out_of_every_job(cluster.pk, policy) == {}


def test_a_restart_keeps_out_the_clusters_bad_nodes_and_says_where_each_came_from() -> None:
    history = History(2, 0, frozenset({"gpu-004"}), {"gpu-009": ClusterNodeState.UNHEALTHY})
    crash = Anomaly(kind="crash", category="nccl_timeout", attribution="unknown")
    decision = decide(crash, Policy(), history)
    assert decision.action == RecommendationAction.RESTART_EXCLUDING
    assert decision.excluded_nodes == ["gpu-004", "gpu-009"]
    assert decision.exclusion_sources == {
        "gpu-004": "earlier attempt",
        "gpu-009": "cluster: unhealthy",
    }
    assert "excluding gpu-004" in decision.reason
    assert "keeping out the cluster's gpu-009 (unhealthy)" in decision.reason


def test_job_b_is_restarted_without_the_node_job_a_s_xid_made_unhealthy() -> None:
    """
    GIVEN node gpu-003 made unhealthy by an Xid in its kernel log while job A ran on it
    WHEN job B, elsewhere, crashes with an error that implicates no node
    THEN B's restart keeps gpu-003 out, and its recommendation and trail say why
    """
    cluster, nodes = cluster_with_nodes()
    Policy.objects.create(name="lab", cluster=cluster, blast_radius_percent=100)
    Node.objects.filter(pk=nodes[2].pk).update(
        health=NodeHealth.UNHEALTHY, last_implicated_at=timezone.now()
    )
    job_b = WorkloadFactory(cluster=cluster)
    crash = AnomalyFactory(
        workload=job_b, category="nccl_timeout", attribution="unknown", implicated_nodes=[]
    )
    recommendation = recommend(crash)

    assert recommendation is not None
    assert recommendation.action == RecommendationAction.RESTART_EXCLUDING
    assert recommendation.excluded_nodes == ["gpu-003"]
    assert recommendation.exclusion_sources == {"gpu-003": "cluster: unhealthy"}
    assert recommendation.status == RecommendationStatus.READY
    event = AuditEvent.objects.get(kind=AuditKind.RECOMMENDED)
    assert event.payload["exclusion_sources"] == {"gpu-003": "cluster: unhealthy"}


def test_keeping_out_more_than_the_blast_radius_asks_a_person() -> None:
    cluster, nodes = cluster_with_nodes()
    Policy.objects.create(name="lab", cluster=cluster, blast_radius_percent=20)
    Node.objects.filter(pk__in=[n.pk for n in nodes[:3]]).update(
        health=NodeHealth.UNHEALTHY, last_implicated_at=timezone.now()
    )
    crash = AnomalyFactory(
        workload=WorkloadFactory(cluster=cluster),
        category="nccl_timeout",
        attribution="unknown",
        implicated_nodes=[],
    )
    recommendation = recommend(crash)
    assert recommendation is not None
    assert recommendation.excluded_nodes == ["gpu-001", "gpu-002", "gpu-003"]
    assert recommendation.status == RecommendationStatus.AWAITING_APPROVAL
