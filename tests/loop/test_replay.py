"""Replaying a policy over recorded decisions: the policies in force reproduce them, a draft
shows what it would have changed, and nothing is written or sent."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from recovery.choices import (
    ClusterMode,
    EvidenceSource,
    RecommendationAction,
    RecommendationStatus,
    StopReason,
)
from recovery.demo.fleet import seed_demo_cluster
from recovery.loop import recommendations
from recovery.loop.anomalies import record_anomalies
from recovery.loop.policy import decide_when_ready
from recovery.loop.replay import (
    DIFFERENT,
    MADE,
    NOT_MADE,
    NOT_REPLAYABLE,
    SAME,
    Action,
    ReplayedDecision,
    ReplayReport,
    replay,
)
from recovery.models import Anomaly, Attempt, AuditEvent, Cluster, Node, Policy, Recommendation
from tests.factories import AnomalyFactory, AttemptFactory, ClusterFactory, WorkloadFactory, xid_79

pytestmark = pytest.mark.django_db

NOW = datetime(2025, 6, 3, 12, 0, tzinfo=UTC)
WINDOW = (NOW - timedelta(days=30), NOW + timedelta(days=1))


def test_replaying_the_policies_in_force_over_the_demo_reproduces_every_decision() -> None:
    seed_demo_cluster(now=NOW)
    for cluster in Cluster.objects.all():
        report = replay(cluster, *WINDOW)
        assert report.decisions, cluster.name
        assert report.verdicts[NOT_REPLAYABLE] == 0
        differing = [d for d in report.decisions if d.verdict != SAME]
        assert differing == [], cluster.name
        assert report.recorded == report.replayed


def window() -> tuple[datetime, datetime]:
    now = timezone.now()
    return now - timedelta(hours=1), now + timedelta(minutes=1)


def stored() -> tuple[object, ...]:
    """Everything a replay must leave as it is."""
    return (
        AuditEvent.objects.count(),
        list(Recommendation.objects.order_by("pk").values_list("pk", "status", "updated_at")),
        list(Anomaly.objects.order_by("pk").values_list("pk", "decision_facts", "decided_at")),
        list(Policy.objects.order_by("pk").values_list("pk", "max_attempts", "updated_at")),
    )


def crash_on_third_attempt(cluster: Cluster) -> Anomaly:
    """A hardware crash on the third attempt of a job that saves checkpoints: a budget of
    three is spent."""
    workload = WorkloadFactory(cluster=cluster, current_attempt=3)
    for number in (1, 2):
        AttemptFactory(
            workload=workload, number=number, exit_state="FAILED", produced_checkpoint=True
        )
    third = AttemptFactory(workload=workload, number=3)
    anomaly: Anomaly = AnomalyFactory(workload=workload, attempt=third)
    decide_when_ready(anomaly)
    return anomaly


def recorded(decision: ReplayedDecision) -> Action:
    assert decision.recorded is not None
    return decision.recorded


def replayed(decision: ReplayedDecision) -> Action:
    assert decision.replayed is not None
    return decision.replayed


def only(report: ReplayReport) -> ReplayedDecision:
    (decision,) = [d for d in report.decisions if d.kind == "decision"]
    return decision


def test_a_draft_with_a_larger_retry_budget_restarts_where_the_policy_stopped() -> None:
    cluster = ClusterFactory()
    policy = Policy.objects.create(name="strict", cluster=cluster, max_attempts=3)
    crash_on_third_attempt(cluster)
    stop = Recommendation.objects.get()
    assert (stop.action, stop.stop_reason) == (RecommendationAction.STOP, StopReason.RETRY_BUDGET)
    before = stored()

    as_it_was = replay(cluster, *window())
    assert [d.verdict for d in as_it_was.decisions] == [SAME]
    assert as_it_was.recorded == as_it_was.replayed
    assert (as_it_was.recorded.stops, as_it_was.recorded.restarts) == (1, 0)

    policy.max_attempts = 10
    report = replay(cluster, *window(), draft=policy)
    decision = only(report)
    assert decision.verdict == DIFFERENT
    assert recorded(decision).action == RecommendationAction.STOP
    assert replayed(decision).action == RecommendationAction.RESTART_EXCLUDING
    assert replayed(decision).excluded_nodes == ("gpu-002",)
    assert "the draft (strict) decides differently" in decision.explanation
    assert (report.replayed.stops, report.replayed.restarts) == (0, 1)
    assert report.replayed.nodes_excluded == 1
    assert report.replayed.node_hours_excluded == 24.0
    assert report.stops_operators_let_run == []
    assert stored() == before  # the draft was neither saved nor anything written


def test_a_stop_operators_rejected_is_counted_against_a_draft_that_would_stop() -> None:
    cluster = ClusterFactory()
    workload = WorkloadFactory(cluster=cluster, current_attempt=1)
    attempt = AttemptFactory(workload=workload, number=1)
    decide_when_ready(AnomalyFactory(workload=workload, attempt=attempt))
    restart = Recommendation.objects.get()
    recommendations.reject(restart.pk, operator="olivia", note="the node is fine")

    draft = Policy(name="stop on crash", cluster=cluster, crash_action=RecommendationAction.STOP)
    report = replay(cluster, *window(), draft=draft)
    decision = only(report)
    assert decision.verdict == DIFFERENT
    assert decision.recorded_status == RecommendationStatus.REJECTED
    assert decision.recorded_by == "olivia"
    assert report.rejected_actions_taken == [decision]
    assert report.stops_operators_let_run == [decision]
    assert report.policy == "draft of stop on crash (not saved)"
    assert not Policy.objects.filter(name="stop on crash").exists()


def test_a_draft_that_drains_no_nodes_leaves_out_the_drain() -> None:
    cluster = ClusterFactory(mode=ClusterMode.ACTION, acknowledge_scheduler_actions=True)
    policy = Policy.objects.create(name="lab", cluster=cluster)
    for n in range(1, 21):
        Node.objects.create(cluster=cluster, name=f"gpu-{n:03d}", scheduler_state="ALLOCATED")
    attempt = AttemptFactory(workload=WorkloadFactory(cluster=cluster), nodes=["gpu-002"])
    record_anomalies(
        attempt.workload,
        attempt,
        [xid_79("gpu-002")],
        timezone.now(),
        scope="kernel:gpu-002",
        source=EvidenceSource.KERNEL_LOG,
    )
    assert Recommendation.objects.filter(action=RecommendationAction.DRAIN).count() == 1

    assert {d.verdict for d in replay(cluster, *window()).decisions} == {SAME}
    policy.drain_nodes = False
    report = replay(cluster, *window(), draft=policy)
    drains = [d for d in report.decisions if d.kind == "drain"]
    assert [(d.verdict, recorded(d).node) for d in drains] == [(NOT_MADE, "gpu-002")]
    assert "the policy drains no nodes" in drains[0].explanation
    assert (report.recorded.drains, report.replayed.drains) == (1, 0)
    # The job's own restart without the node is the same either way.
    assert only(report).verdict == SAME


def test_a_policy_edited_since_explains_the_difference() -> None:
    cluster = ClusterFactory()
    policy = Policy.objects.create(name="strict", cluster=cluster, max_attempts=3)
    crash_on_third_attempt(cluster)
    policy.max_attempts = 4
    policy.save()
    decision = only(replay(cluster, *window()))
    assert decision.verdict == DIFFERENT
    assert "'strict' was edited at" in decision.explanation


def test_a_policy_enabled_since_explains_the_difference() -> None:
    cluster = ClusterFactory()
    crash_on_third_attempt(cluster)  # the built-in defaults: ten attempts
    Policy.objects.create(name="tight", cluster=cluster, max_attempts=2)
    decision = only(replay(cluster, *window()))
    assert decision.verdict == DIFFERENT
    assert "'tight' applies now; 'built-in defaults' applied then" in decision.explanation


def test_a_decision_made_before_facts_were_recorded_is_not_replayable() -> None:
    cluster = ClusterFactory()
    anomaly = crash_on_third_attempt(cluster)
    Anomaly.objects.filter(pk=anomaly.pk).update(decision_facts={})
    decision = only(replay(cluster, *window()))
    assert decision.verdict == NOT_REPLAYABLE
    assert decision.explanation == "decided before decision facts were recorded"
    assert recorded(decision).action == RecommendationAction.RESTART_EXCLUDING
    assert decision.replayed is None


def test_a_draft_that_restarts_where_nothing_was_made_says_made() -> None:
    cluster = ClusterFactory()
    Policy.objects.create(name="record", cluster=cluster, crash_action=RecommendationAction.NONE)
    workload = WorkloadFactory(cluster=cluster, current_attempt=1)
    attempt = AttemptFactory(workload=workload, number=1)
    decide_when_ready(AnomalyFactory(workload=workload, attempt=attempt))
    assert not Recommendation.objects.exists()
    draft = Policy.objects.get(name="record")
    draft.crash_action = RecommendationAction.RESTART
    decision = only(replay(cluster, *window(), draft=draft))
    assert decision.verdict == MADE
    assert replayed(decision).action == RecommendationAction.RESTART_EXCLUDING
    assert replayed(decision).needs_person  # monitor mode


def test_later_decisions_of_a_job_the_draft_stopped_are_not_counted() -> None:
    cluster = ClusterFactory()
    workload = WorkloadFactory(cluster=cluster, current_attempt=1)
    first = AttemptFactory(workload=workload, number=1)
    decide_when_ready(AnomalyFactory(workload=workload, attempt=first))
    Attempt.objects.filter(pk=first.pk).update(exit_state="FAILED")
    workload.current_attempt = 2
    workload.save()
    second = AttemptFactory(workload=workload, number=2)
    decide_when_ready(AnomalyFactory(workload=workload, attempt=second))
    assert Recommendation.objects.count() == 2

    draft = Policy(name="stop", cluster=cluster, crash_action=RecommendationAction.STOP)
    report = replay(cluster, *window(), draft=draft)
    assert [d.verdict for d in report.decisions] == [DIFFERENT, "after the draft's stop"]
    assert (report.replayed.stops, report.replayed.restarts) == (1, 0)
    assert (report.recorded.stops, report.recorded.restarts) == (0, 2)


def test_a_decision_the_policy_engine_gave_up_on_says_so() -> None:
    cluster = ClusterFactory()
    anomaly = crash_on_third_attempt(cluster)
    Recommendation.objects.all().delete()
    details = {**anomaly.details, "policy_error": "OperationalError: gone", "policy_tries": 5}
    Anomaly.objects.filter(pk=anomaly.pk).update(decision_facts={}, details=details)
    decision = only(replay(cluster, *window()))
    assert decision.verdict == NOT_REPLAYABLE
    assert decision.explanation == (
        "the policy engine failed on it and gave up (OperationalError: gone)"
    )


@pytest.mark.parametrize("over_the_radius", [False, True], ids=["within", "over"])
def test_a_decision_recorded_with_facts_of_version_1_replays_as_it_was_made(
    over_the_radius: bool,
) -> None:
    """
    GIVEN a restart decided in an acting cluster with a 50 % blast radius on two nodes, its
          facts then rewritten as version 1 held them (every node other jobs excluded named,
          one here: gpu-002 itself, or gpu-001 beside it)
    WHEN the policies in force are replayed
    THEN the version-1 facts are read and the decision is reproduced: ready within the radius,
         waiting for a person over it
    """
    cluster = ClusterFactory(mode=ClusterMode.ACTION, acknowledge_scheduler_actions=True)
    for name in ("gpu-001", "gpu-002"):
        Node.objects.create(cluster=cluster, name=name)
    Policy.objects.create(name="half", blast_radius_percent=50)
    workload = WorkloadFactory(cluster=cluster, current_attempt=1)
    anomaly: Anomaly = AnomalyFactory(
        workload=workload, attempt=AttemptFactory(workload=workload, number=1)
    )
    decide_when_ready(anomaly)
    anomaly.refresh_from_db()
    facts = dict(anomaly.decision_facts)
    assert facts["v"] == 2
    other = "gpu-001" if over_the_radius else "gpu-002"
    facts["result"] = {**facts["result"], "needs_person": over_the_radius}
    del facts["excluded_by_minute"], facts["excluded_at"]
    Anomaly.objects.filter(pk=anomaly.pk).update(
        decision_facts={**facts, "v": 1, "recent_exclusions": [[facts["at"], [other]]]}
    )
    report = replay(cluster, *window())
    decision = only(report)
    assert decision.verdict == SAME, decision.explanation
    assert replayed(decision).needs_person is over_the_radius
