"""The policy engine: decisions from anomaly, history and policy; one recommendation per failure."""

from __future__ import annotations

import pytest

from recovery.choices import (
    AnomalyKind,
    AuditKind,
    ClusterMode,
    OptInMode,
    RecommendationAction,
    RecommendationStatus,
    StopReason,
    StragglerAction,
)
from recovery.loop.policy import History, decide, policy_for, recommend
from recovery.loop.recommendations import approve
from recovery.models import Anomaly, Attempt, AuditEvent, Node, Policy, Recommendation
from tests.factories import AnomalyFactory, ClusterFactory, WorkloadFactory

FRESH = History(attempts=1, attempts_without_checkpoint=0)


def anomaly(**fields: object) -> Anomaly:
    values: dict[str, object] = {
        "kind": AnomalyKind.CRASH,
        "category": "gpu_hardware",
        "attribution": "hardware",
        "implicated_nodes": ["gpu-007"],
    }
    values.update(fields)
    return Anomaly(**values)


def test_hardware_on_a_named_node_restarts_without_that_node() -> None:
    decision = decide(anomaly(), Policy(), FRESH)
    assert decision.action == RecommendationAction.RESTART_EXCLUDING
    assert decision.excluded_nodes == ["gpu-007"]


def test_an_application_exception_restarts_without_excluding() -> None:
    decision = decide(anomaly(category="app_exception", attribution="application"), Policy(), FRESH)
    assert decision.action == RecommendationAction.RESTART
    assert decision.excluded_nodes == []


def test_nodes_excluded_before_stay_excluded() -> None:
    history = History(2, 0, frozenset({"gpu-003"}))
    decision = decide(anomaly(category="nccl_timeout", attribution="unknown"), Policy(), history)
    assert decision.excluded_nodes == ["gpu-003"]


def test_it_stops_when_retries_stop_paying_off() -> None:
    policy = Policy(max_attempts_without_checkpoint=3)
    decision = decide(anomaly(), policy, History(attempts=4, attempts_without_checkpoint=3))
    assert decision.action == RecommendationAction.STOP
    assert "saved no checkpoint" in decision.reason
    assert decision.stop_reason == StopReason.NO_CHECKPOINT


def test_it_stops_after_the_attempt_budget() -> None:
    decision = decide(anomaly(), Policy(max_attempts=5), History(5, 0))
    assert decision.action == RecommendationAction.STOP
    assert decision.stop_reason == StopReason.RETRY_BUDGET


def test_an_application_fault_stops_at_once_only_when_the_policy_says_so() -> None:
    bug = anomaly(category="app_exception", attribution="application")
    assert decide(bug, Policy(), FRESH).action == RecommendationAction.RESTART
    stop = decide(bug, Policy(stop_on_application_fault=True), FRESH)
    assert (stop.action, stop.stop_reason) == ("stop", StopReason.APPLICATION_FAULT)


def test_a_straggler_is_recorded_or_excluded_as_the_policy_says() -> None:
    slow = anomaly(kind=AnomalyKind.STRAGGLER, category="", attribution="unknown")
    assert decide(slow, Policy(), FRESH).action == RecommendationAction.NONE
    policy = Policy(straggler_action=StragglerAction.RESTART_EXCLUDING)
    assert decide(slow, policy, FRESH).excluded_nodes == ["gpu-007"]


@pytest.mark.django_db
def test_the_most_specific_policy_wins() -> None:
    workload = WorkloadFactory(partition="gpu", environment="prod")
    Policy.objects.create(name="everywhere", max_attempts=3)
    Policy.objects.create(name="prod", environment="prod", max_attempts=4)
    Policy.objects.create(name="prod gpu here", cluster=workload.cluster, environment="prod",
                          partition="gpu", max_attempts=5)  # fmt: skip
    Policy.objects.create(name="other partition", environment="prod", partition="cpu")
    assert policy_for(workload).name == "prod gpu here"


@pytest.mark.django_db
def test_monitor_mode_records_what_it_would_have_done() -> None:
    found = AnomalyFactory(workload=WorkloadFactory(cluster=ClusterFactory()))
    recommendation = recommend(found)
    assert recommendation is not None
    assert recommendation.status == RecommendationStatus.AWAITING_APPROVAL
    event = AuditEvent.objects.get(kind=AuditKind.RECOMMENDED)
    assert event.payload["would_have_done"] is True


@pytest.mark.django_db
def test_an_acknowledged_action_mode_cluster_gets_a_ready_recommendation() -> None:
    cluster = ClusterFactory(mode=ClusterMode.ACTION, acknowledge_scheduler_actions=True)
    recommendation = recommend(AnomalyFactory(workload=WorkloadFactory(cluster=cluster)))
    assert recommendation is not None and recommendation.status == RecommendationStatus.READY


@pytest.mark.django_db
def test_a_job_opted_in_to_be_observed_waits_for_a_person_in_an_acting_cluster() -> None:
    """
    GIVEN an acknowledged action-mode cluster
    WHEN a job whose comment says "mode": "observe" fails
    THEN its recommendation awaits approval, and the trail says the job's mode held it back
    """
    cluster = ClusterFactory(mode=ClusterMode.ACTION, acknowledge_scheduler_actions=True)
    observed = WorkloadFactory(cluster=cluster, opt_in_mode=OptInMode.OBSERVE)
    recommendation = recommend(AnomalyFactory(workload=observed))
    assert recommendation is not None
    assert recommendation.status == RecommendationStatus.AWAITING_APPROVAL
    event = AuditEvent.objects.get(kind=AuditKind.RECOMMENDED)
    assert (event.payload["job_mode"], event.payload["would_have_done"]) == ("observe", True)

    approved = approve(recommendation.pk, operator="olivia")
    assert approved.recommendation.status == RecommendationStatus.READY
    assert approved.recommendation.approved_by == "olivia"


@pytest.mark.django_db
def test_one_failure_gives_one_recommendation_and_new_evidence_supersedes_it() -> None:
    cluster = ClusterFactory(mode=ClusterMode.ACTION, acknowledge_scheduler_actions=True)
    workload = WorkloadFactory(cluster=cluster)
    attempt = Attempt.objects.create(workload=workload, number=1)
    timeout = AnomalyFactory(workload=workload, attempt=attempt, category="nccl_timeout",
                             attribution="unknown", implicated_nodes=[])  # fmt: skip
    first = recommend(timeout)
    assert recommend(timeout) == first  # the same failure again
    xid = AnomalyFactory(workload=workload, attempt=attempt, implicated_nodes=["gpu-007"])
    second = recommend(xid)
    assert second is not None and second != first
    first.refresh_from_db()  # type: ignore[union-attr]
    assert first.status == RecommendationStatus.SUPERSEDED  # type: ignore[union-attr]
    assert first.superseded_by == second  # type: ignore[union-attr]
    open_ones = Recommendation.objects.filter(status=RecommendationStatus.READY)
    assert list(open_ones) == [second]


@pytest.mark.django_db
def test_excluding_too_much_of_the_cluster_asks_a_person() -> None:
    cluster = ClusterFactory(mode=ClusterMode.ACTION, acknowledge_scheduler_actions=True)
    for number in range(1, 11):
        Node.objects.create(cluster=cluster, name=f"gpu-{number:03d}")
    Policy.objects.create(name="tight", blast_radius_percent=10)
    workload = WorkloadFactory(cluster=cluster)
    wide = AnomalyFactory(workload=workload, implicated_nodes=["gpu-001", "gpu-002"])
    recommendation = recommend(wide)
    assert recommendation is not None
    assert recommendation.status == RecommendationStatus.AWAITING_APPROVAL
