"""The policy recommends only what the cluster's scheduler can carry out.

A scheduler's adapter says what it can do (``Capabilities``); a decision it cannot carry out is
recorded with the reason and never offered for approval. Decisions recorded before capabilities
were are Slurm's, which can do all of it, and replay as they were decided.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from recovery.choices import (
    Attribution,
    AuditKind,
    ClusterMode,
    EvidenceSource,
    RecommendationAction,
)
from recovery.loop.anomalies import record_anomalies
from recovery.loop.decision_facts import capabilities_from
from recovery.loop.policy import decide_when_ready, recommend
from recovery.loop.replay import SAME, replay
from recovery.models import Anomaly, AuditEvent, Cluster, Node, Policy, Recommendation
from recovery.schedulers import registry
from recovery.schedulers.capabilities import Capabilities
from recovery.schedulers.slurm import SLURM_CAPABILITIES
from tests.factories import AnomalyFactory, AttemptFactory, ClusterFactory, WorkloadFactory, xid_79

pytestmark = pytest.mark.django_db

NO_EXCLUSIONS = Capabilities(requeue=True, hold=True)


def acting_cluster() -> Cluster:
    cluster: Cluster = ClusterFactory(mode=ClusterMode.ACTION, acknowledge_scheduler_actions=True)
    return cluster


def test_a_restart_the_scheduler_cannot_keep_nodes_out_of_is_recorded_not_recommended(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """
    GIVEN a cluster whose scheduler can restart a job but not keep nodes out of it
    WHEN a GPU falls off the bus on one of its job's nodes
    THEN nothing is recommended (a restart onto the same node would fail again), and the
    decision says what the scheduler cannot do
    """
    cluster = acting_cluster()
    monkeypatch.setitem(registry.CAPABILITIES, cluster.connection, NO_EXCLUSIONS)
    anomaly = AnomalyFactory(workload=WorkloadFactory(cluster=cluster))

    assert recommend(anomaly) is None

    assert not Recommendation.objects.exists()
    result = anomaly.decision_facts["result"]
    assert (result["outcome"], result["action"]) == ("no action", RecommendationAction.NONE)
    assert result["why"].endswith(
        "not recommended: this cluster's scheduler cannot keep nodes out of a restarted job"
    )
    assert anomaly.decision_facts["capabilities"] == NO_EXCLUSIONS.as_facts()


def test_the_same_failure_is_recommended_where_the_scheduler_can_keep_nodes_out() -> None:
    anomaly = AnomalyFactory(workload=WorkloadFactory(cluster=acting_cluster()))
    recommendation = recommend(anomaly)
    assert recommendation is not None
    assert recommendation.action == RecommendationAction.RESTART_EXCLUDING
    assert anomaly.decision_facts["capabilities"] == SLURM_CAPABILITIES.as_facts()


def test_a_restart_that_excludes_nothing_needs_no_exclusions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = acting_cluster()
    monkeypatch.setitem(registry.CAPABILITIES, cluster.connection, NO_EXCLUSIONS)
    anomaly = AnomalyFactory(
        workload=WorkloadFactory(cluster=cluster),
        category="python_exception",
        attribution=Attribution.APPLICATION,
        implicated_nodes=[],
    )
    recommendation = recommend(anomaly)
    assert recommendation is not None and recommendation.action == RecommendationAction.RESTART


def test_a_cluster_without_a_registered_scheduler_has_nothing_recommended(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = acting_cluster()
    monkeypatch.delitem(registry.CAPABILITIES, cluster.connection)
    anomaly = AnomalyFactory(
        workload=WorkloadFactory(cluster=cluster),
        attribution=Attribution.APPLICATION,
        implicated_nodes=[],
    )
    assert recommend(anomaly) is None
    assert anomaly.decision_facts["capabilities"] is None
    assert anomaly.decision_facts["result"]["outcome"] == "no action"
    assert not Recommendation.objects.exists()


def test_capabilities_are_read_from_the_facts_as_they_were_recorded() -> None:
    assert capabilities_from({}) == SLURM_CAPABILITIES  # recorded before capabilities were
    assert capabilities_from({"capabilities": None}) == Capabilities()
    assert capabilities_from({"capabilities": "all"}) == Capabilities()
    assert capabilities_from(
        {"capabilities": {"requeue": "yes", "drain": True, "exclude_on_restart": 1}}
    ) == Capabilities(drain=True)


def test_a_decision_recorded_before_capabilities_replays_as_it_was_decided(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """
    GIVEN a restart excluding a node, decided on facts that recorded no capabilities (as every
          decision before they were)
    WHEN the policies in force are replayed, even where the scheduler now lacks exclusions
    THEN the decision is read as Slurm's and reproduced
    """
    cluster = acting_cluster()
    workload = WorkloadFactory(cluster=cluster, current_attempt=1)
    anomaly: Anomaly = AnomalyFactory(
        workload=workload, attempt=AttemptFactory(workload=workload, number=1)
    )
    decide_when_ready(anomaly)
    anomaly.refresh_from_db()
    facts = dict(anomaly.decision_facts)
    del facts["capabilities"]
    Anomaly.objects.filter(pk=anomaly.pk).update(decision_facts=facts)
    monkeypatch.setitem(registry.CAPABILITIES, cluster.connection, NO_EXCLUSIONS)

    now = timezone.now()
    (decision,) = [
        d
        for d in replay(cluster, now - timedelta(hours=1), now + timedelta(minutes=1)).decisions
        if d.kind == "decision"
    ]

    assert decision.verdict == SAME, decision.explanation


def test_no_drain_is_proposed_where_the_scheduler_cannot_drain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = acting_cluster()
    Policy.objects.create(name="lab", cluster=cluster, blast_radius_percent=50)
    for name in ("gpu-001", "gpu-002", "gpu-003", "gpu-004"):
        Node.objects.create(cluster=cluster, name=name, scheduler_state="ALLOCATED")
    monkeypatch.setitem(registry.CAPABILITIES, cluster.connection, NO_EXCLUSIONS)
    attempt = AttemptFactory(workload=WorkloadFactory(cluster=cluster), nodes=["gpu-002"])

    record_anomalies(
        attempt.workload,
        attempt,
        [xid_79("gpu-002")],
        timezone.now(),
        scope="kernel:gpu-002",
        source=EvidenceSource.KERNEL_LOG,
    )

    assert not Recommendation.objects.filter(action=RecommendationAction.DRAIN).exists()
    anomaly = Anomaly.objects.get()
    assert anomaly.drain_facts["result"] == {"gpu-002": "drains off"}
    assert not AuditEvent.objects.filter(kind=AuditKind.DRAIN_REFUSED).exists()
