"""Action precision: the loop's actions per cluster, and which were later judged unnecessary."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.utils import timezone
from pytest_django import DjangoAssertNumQueries

from recovery.audit.payloads import payload_problems
from recovery.choices import (
    AuditKind,
    NodeHealth,
    RecommendationAction,
    RecommendationStatus,
)
from recovery.loop import leases, recommendations
from recovery.loop.node_health import return_to_service
from recovery.models import AuditEvent, Cluster, Node, Recommendation
from recovery.read.precision import (
    RESUME_WITHIN,
    ClusterPrecision,
    Unnecessary,
    action_precision,
)
from tests.factories import (
    AnomalyFactory,
    ClusterFactory,
    RecommendationFactory,
    WorkloadFactory,
    carried_out,
    node_returned,
    progress_resumed,
    rejected_by,
    resume_requested,
)

pytestmark = pytest.mark.django_db

EVIDENCE = "NVRM: Xid (PCI:0000:3b:00): 79, pid=2231, GPU has fallen off the bus."


@pytest.fixture
def now() -> datetime:
    return timezone.now()


def restart(
    cluster: Cluster, *, action: str = RecommendationAction.RESTART_EXCLUDING, **fields: object
) -> Recommendation:
    """A restart the policy recommended for a job in its first attempt, approved."""
    workload = WorkloadFactory(cluster=cluster, current_attempt=1)
    fields.setdefault("status", RecommendationStatus.READY)
    return RecommendationFactory(
        workload=workload,
        anomaly=AnomalyFactory(workload=workload, evidence_line=EVIDENCE),
        action=action,
        **fields,
    )


def drain(cluster: Cluster, node_name: str = "gpu-002") -> Recommendation:
    """A drain of ``node_name`` the policy recommended from a site fact, approved."""
    workload = WorkloadFactory(cluster=cluster)
    node, _ = Node.objects.get_or_create(cluster=cluster, name=node_name)
    return RecommendationFactory(
        workload=workload,
        anomaly=AnomalyFactory(workload=workload, evidence_line=EVIDENCE),
        action=RecommendationAction.DRAIN,
        node=node,
        excluded_nodes=[],
        status=RecommendationStatus.READY,
    )


def precision_of(cluster: Cluster, now: datetime) -> ClusterPrecision:
    (row,) = action_precision([cluster], since=now - timedelta(days=7), until=now).rows
    return row


# --- the step reached, recorded when a restart is dispatched -----------------------------------


def test_a_restarts_dispatch_records_the_step_the_job_had_reached() -> None:
    """
    GIVEN a job whose last progress line was step 1,150, and a restart of it a controller holds
    WHEN the controller records the command it is about to run
    THEN the ``dispatched`` event says the job had reached step 1,150, as its kind declares;
         a drain's dispatch, and a restart's of a job that never reported progress, say nothing
    """
    cluster = ClusterFactory()
    restarting = restart(cluster)
    restarting.workload.last_progress_step = 1150
    restarting.workload.save()
    draining = drain(cluster)
    draining.workload.last_progress_step = 900
    draining.workload.save()
    silent = restart(cluster)
    for recommendation in (restarting, draining, silent):
        recommendations.claim(
            recommendation.pk, controller="controller:c1", instance="i-1", lease_seconds=120
        )
    events = [
        leases.record_dispatch(
            recommendation.pk,
            controller="controller:c1",
            instance="i-1",
            argv=["scontrol", "requeuehold", recommendation.workload.job_id],
            sequence=1,
        )
        for recommendation in (restarting, draining, silent)
    ]
    assert [event.payload.get("step_reached") for event in events] == [1150, None, None]
    assert "step_reached" not in events[1].payload
    assert "step_reached" not in events[2].payload
    assert all(payload_problems(event.kind, event.payload) == [] for event in events)


# --- rule: a restart after which the job resumed where it was ---------------------------------


def test_a_restart_after_which_the_job_resumed_where_it_was_is_unnecessary(now: datetime) -> None:
    """
    GIVEN a restart done when the job had reached step 1,150, after which its next attempt
          resumed at step 1,150; and another after which the job resumed past where it was
    THEN both are taken and judged unnecessary: no work was lost, nothing was mended
    """
    cluster = ClusterFactory()
    at_the_step = carried_out(restart(cluster), now - timedelta(hours=3), step_reached=1150)
    progress_resumed(at_the_step.workload, 2, 1150, now - timedelta(hours=2))
    past_it = carried_out(restart(cluster), now - timedelta(hours=3), step_reached=1150)
    progress_resumed(past_it.workload, 2, 1200, now - timedelta(hours=2))

    result = action_precision([cluster], since=now - timedelta(days=7), until=now)

    (row,) = result.rows
    assert (row.taken, row.restarts, row.resumed_in_place, row.unnecessary) == (2, 2, 2, 2)
    assert row.precision == 0.0
    judged = {item.recommendation_id: item for item in result.judged}
    assert set(judged) == {at_the_step.pk, past_it.pk}
    item = judged[past_it.pk]
    assert item.reason == Unnecessary.RESUMED_IN_PLACE
    assert (item.step_reached, item.resumed_step) == (1150, 1200)
    assert item.judged_at == now - timedelta(hours=2)
    assert item.evidence_line == EVIDENCE
    assert item.recommendation == past_it
    assert item.cluster == cluster


def test_a_restart_that_resumed_from_a_checkpoint_below_the_step_reached_is_not_judged(
    now: datetime,
) -> None:
    """
    GIVEN a restart done at step 1,150 after which the job resumed from its checkpoint at 1,000
    THEN it was taken and is not judged unnecessary: the restart cost the usual work and was due
    """
    cluster = ClusterFactory()
    restarted = carried_out(restart(cluster), now - timedelta(hours=3), step_reached=1150)
    progress_resumed(restarted.workload, 2, 1000, now - timedelta(hours=2))

    result = action_precision([cluster], since=now - timedelta(days=7), until=now)

    (row,) = result.rows
    assert (row.taken, row.unnecessary, row.precision) == (1, 0, 1.0)
    assert result.judged == []


def test_only_the_first_attempt_after_the_restart_judges_it(now: datetime) -> None:
    """
    GIVEN a restart at step 1,150 of a job in its second attempt, whose second attempt had
          resumed at 5,000 (before the restart), whose third resumed from a checkpoint at 1,000,
          and whose fourth resumed at 2,000 after another failure
    THEN the restart is not judged: the attempt right after it lost work
    """
    cluster = ClusterFactory()
    recommendation = restart(cluster)
    workload = recommendation.workload
    progress_resumed(workload, 2, 5000, now - timedelta(hours=5))
    carried_out(recommendation, now - timedelta(hours=3), step_reached=1150)
    progress_resumed(workload, 3, 1000, now - timedelta(hours=2))
    progress_resumed(workload, 4, 2000, now - timedelta(hours=1))

    assert precision_of(cluster, now).unnecessary == 0


def test_a_restart_recorded_without_the_step_reached_is_never_judged(now: datetime) -> None:
    """Restarts dispatched before the step was recorded, or of a job that never progressed."""
    cluster = ClusterFactory()
    restarted = carried_out(restart(cluster), now - timedelta(hours=3))
    progress_resumed(restarted.workload, 2, 99_999, now - timedelta(hours=2))

    row = precision_of(cluster, now)
    assert (row.taken, row.unnecessary) == (1, 0)


def test_a_restart_not_yet_followed_by_progress_is_not_judged(now: datetime) -> None:
    cluster = ClusterFactory()
    carried_out(restart(cluster), now - timedelta(minutes=5), step_reached=1150)
    row = precision_of(cluster, now)
    assert (row.taken, row.unnecessary, row.precision) == (1, 0, 1.0)


# --- rule: a drained node returned to service within the hour ----------------------------------


@pytest.mark.parametrize(
    "returned_after",
    [timedelta(minutes=1), timedelta(minutes=59), RESUME_WITHIN],
    ids=["1 min", "59 min", "60 min"],
)
def test_a_drained_node_returned_to_service_within_an_hour_makes_the_drain_unnecessary(
    now: datetime, returned_after: timedelta
) -> None:
    cluster = ClusterFactory()
    drained_at = now - timedelta(hours=3)
    drained = carried_out(drain(cluster, "gpu-007"), drained_at)
    node_returned(cluster, "gpu-007", "otto", drained_at + returned_after)

    result = action_precision([cluster], since=now - timedelta(days=7), until=now)

    (row,) = result.rows
    assert (row.taken, row.drains, row.returned_within_an_hour, row.unnecessary) == (1, 1, 1, 1)
    (item,) = result.judged
    assert item.reason == Unnecessary.RETURNED_WITHIN_AN_HOUR
    assert (item.recommendation_id, item.judged_by) == (drained.pk, "otto")
    assert item.judged_after_s == returned_after.total_seconds()
    assert item.recommendation is not None and item.recommendation.node is not None
    assert item.recommendation.node.name == "gpu-007"
    assert item.evidence_line == EVIDENCE


def test_a_drained_node_returned_after_61_minutes_leaves_the_drain_standing(
    now: datetime,
) -> None:
    cluster = ClusterFactory()
    drained_at = now - timedelta(hours=3)
    carried_out(drain(cluster, "gpu-007"), drained_at)
    node_returned(cluster, "gpu-007", "otto", drained_at + timedelta(minutes=61))

    row = precision_of(cluster, now)
    assert (row.taken, row.unnecessary, row.precision) == (1, 0, 1.0)


def test_a_resume_in_the_scheduler_within_the_hour_counts_like_a_return_to_service(
    now: datetime,
) -> None:
    cluster = ClusterFactory()
    drained_at = now - timedelta(hours=3)
    drained = carried_out(drain(cluster, "gpu-007"), drained_at)
    resume_requested(drained, "otto", drained_at + timedelta(minutes=20))

    row = precision_of(cluster, now)
    assert (row.taken, row.returned_within_an_hour, row.precision) == (1, 1, 0.0)


def test_only_a_return_of_the_same_node_on_the_same_cluster_after_the_drain_counts(
    now: datetime,
) -> None:
    cluster, other = ClusterFactory(), ClusterFactory()
    drained_at = now - timedelta(hours=3)
    carried_out(drain(cluster, "gpu-007"), drained_at)
    node_returned(cluster, "gpu-008", "otto", drained_at + timedelta(minutes=5))  # another node
    node_returned(other, "gpu-007", "otto", drained_at + timedelta(minutes=5))  # another cluster
    node_returned(cluster, "gpu-007", "otto", drained_at - timedelta(minutes=5))  # before it

    assert precision_of(cluster, now).unnecessary == 0


def test_one_drain_returned_twice_counts_once(now: datetime) -> None:
    cluster = ClusterFactory()
    drained_at = now - timedelta(hours=3)
    drained = carried_out(drain(cluster, "gpu-007"), drained_at)
    node_returned(cluster, "gpu-007", "otto", drained_at + timedelta(minutes=5))
    resume_requested(drained, "vera", drained_at + timedelta(minutes=10))

    result = action_precision([cluster], since=now - timedelta(days=7), until=now)
    assert result.rows[0].returned_within_an_hour == 1
    assert [item.judged_by for item in result.judged] == ["otto"]


# --- rule: a recommendation an operator rejected ----------------------------------------------


def test_a_rejected_recommendation_is_counted_apart_and_an_approved_one_is_taken(
    now: datetime,
) -> None:
    """
    GIVEN a restart an operator rejected, and one they approved that a controller then ran
    THEN the rejected one counts as an unnecessary action avoided, not as one taken; the
         approved one is taken, and precision is over it alone
    """
    cluster = ClusterFactory()
    refused = rejected_by(
        restart(cluster, status=RecommendationStatus.AWAITING_APPROVAL),
        "otto",
        now - timedelta(hours=1),
        note="the job checkpoints on its own",
    )
    carried_out(restart(cluster), now - timedelta(hours=1), step_reached=1150)

    result = action_precision([cluster], since=now - timedelta(days=7), until=now)

    (row,) = result.rows
    assert (row.taken, row.rejected, row.unnecessary, row.precision) == (1, 1, 0, 1.0)
    (item,) = result.judged
    assert (item.recommendation_id, item.reason, item.taken) == (
        refused.pk,
        Unnecessary.REJECTED,
        False,
    )
    assert (item.judged_by, item.note) == ("otto", "the job checkpoints on its own")
    assert item.evidence_line == EVIDENCE


def test_a_rejected_drain_is_counted_apart_too(now: datetime) -> None:
    cluster = ClusterFactory()
    recommendation = drain(cluster)
    Recommendation.objects.filter(pk=recommendation.pk).update(
        status=RecommendationStatus.AWAITING_APPROVAL, approved_by=""
    )
    recommendation.refresh_from_db()
    rejected_by(recommendation, "otto", now - timedelta(hours=1))
    row = precision_of(cluster, now)
    assert (row.taken, row.rejected, row.precision) == (0, 1, None)


# --- what counts as taken -----------------------------------------------------------------------


def test_stops_count_as_taken_and_failed_or_skipped_actions_do_not(now: datetime) -> None:
    cluster = ClusterFactory()
    carried_out(restart(cluster, action=RecommendationAction.STOP), now - timedelta(hours=1))
    for kind in (AuditKind.ACTION_FAILED, AuditKind.ACTION_SKIPPED):
        recommendation = restart(cluster)
        AuditEvent.objects.create(
            cluster=cluster,
            workload=recommendation.workload,
            kind=kind,
            actor="controller:c1",
            occurred_at=now - timedelta(hours=1),
            payload={"recommendation": recommendation.pk, "action": recommendation.action},
        )
    row = precision_of(cluster, now)
    assert (row.taken, row.stops, row.restarts, row.precision) == (1, 1, 0, 1.0)


def test_nothing_taken_has_no_precision(now: datetime) -> None:
    row = precision_of(ClusterFactory(), now)
    assert (row.taken, row.unnecessary, row.rejected, row.precision) == (0, 0, 0, None)


def test_the_loops_own_records_are_what_precision_reads(now: datetime) -> None:
    """
    GIVEN a restart an operator approves and a controller claims, dispatches and reports done
          through the loop's functions, after which the job resumes at the step it had reached;
          and a drain carried out the same way, whose node an operator returns to service
    THEN both are judged unnecessary from what the loop recorded
    """
    cluster = ClusterFactory()
    restarting = restart(cluster, status=RecommendationStatus.AWAITING_APPROVAL, approved_by="")
    restarting.workload.last_progress_step = 1150
    restarting.workload.save()
    draining = drain(cluster, "gpu-007")
    node_id = draining.node_id
    assert node_id is not None
    Node.objects.filter(pk=node_id).update(health=NodeHealth.UNHEALTHY)
    recommendations.approve(restarting.pk, operator="otto")
    for recommendation in (restarting, draining):
        recommendations.claim(
            recommendation.pk, controller="controller:c1", instance="i-1", lease_seconds=120
        )
        leases.record_dispatch(
            recommendation.pk,
            controller="controller:c1",
            instance="i-1",
            argv=["scontrol", "requeuehold", "1"],
            sequence=1,
        )
        recommendations.report(
            recommendation.pk,
            controller="controller:c1",
            instance="i-1",
            result=recommendations.ActionReport(
                outcome="executed", state_before={}, commands=[], converged=True
            ),
        )
    progress_resumed(restarting.workload, 2, 1150, timezone.now() + timedelta(seconds=1))
    return_to_service(node_id, operator="otto")

    later = timezone.now() + timedelta(minutes=1)
    result = action_precision([cluster], since=now - timedelta(hours=1), until=later)

    (row,) = result.rows
    assert (row.taken, row.resumed_in_place, row.returned_within_an_hour) == (2, 1, 1)
    assert {(item.recommendation_id, item.reason) for item in result.judged} == {
        (restarting.pk, Unnecessary.RESUMED_IN_PLACE),
        (draining.pk, Unnecessary.RETURNED_WITHIN_AN_HOUR),
    }


# --- clusters, range, bounds -------------------------------------------------------------------


def test_each_cluster_has_its_own_figures(now: datetime) -> None:
    lab, prod, idle = ClusterFactory(), ClusterFactory(), ClusterFactory()
    for _ in range(3):
        carried_out(restart(lab), now - timedelta(hours=3), step_reached=100)
    unnecessary = carried_out(restart(lab), now - timedelta(hours=3), step_reached=100)
    progress_resumed(unnecessary.workload, 2, 100, now - timedelta(hours=2))
    drained_at = now - timedelta(hours=2)
    carried_out(drain(prod, "gpu-007"), drained_at)
    node_returned(prod, "gpu-007", "otto", drained_at + timedelta(minutes=10))
    carried_out(drain(prod, "gpu-008"), drained_at)
    # The same node name on lab, returned: it is not prod's drained node.
    node_returned(lab, "gpu-008", "otto", drained_at + timedelta(minutes=10))

    result = action_precision([idle, prod, lab], since=now - timedelta(days=7), until=now)

    rows = {row.cluster: row for row in result.rows}
    assert [row.cluster for row in result.rows] == [idle, prod, lab]
    assert (rows[lab].taken, rows[lab].unnecessary, rows[lab].precision) == (4, 1, 0.75)
    assert (rows[prod].taken, rows[prod].unnecessary, rows[prod].precision) == (2, 1, 0.5)
    assert (rows[idle].taken, rows[idle].precision) == (0, None)
    assert sorted((item.cluster.pk, item.reason) for item in result.judged if item.cluster) == [
        (lab.pk, Unnecessary.RESUMED_IN_PLACE),
        (prod.pk, Unnecessary.RETURNED_WITHIN_AN_HOUR),
    ]


def test_only_the_clusters_and_the_range_asked_for_are_counted(now: datetime) -> None:
    lab, prod = ClusterFactory(), ClusterFactory()
    old = carried_out(restart(lab), now - timedelta(days=3), step_reached=100)
    progress_resumed(old.workload, 2, 100, now - timedelta(days=3) + timedelta(hours=1))
    rejected_by(
        restart(lab, status=RecommendationStatus.AWAITING_APPROVAL),
        "otto",
        now - timedelta(days=2),
    )
    recent = carried_out(restart(lab), now - timedelta(hours=3), step_reached=100)
    progress_resumed(recent.workload, 2, 100, now - timedelta(hours=2))
    carried_out(restart(prod), now - timedelta(hours=3), step_reached=100)
    # After the range's end.
    carried_out(restart(lab), now + timedelta(minutes=10), step_reached=100)

    day = action_precision([lab], since=now - timedelta(hours=24), until=now)
    week = action_precision([lab], since=now - timedelta(days=7), until=now)

    assert [row.cluster for row in day.rows] == [lab]
    assert (day.rows[0].taken, day.rows[0].unnecessary, day.rows[0].rejected) == (1, 1, 0)
    assert [item.recommendation_id for item in day.judged] == [recent.pk]
    assert (week.rows[0].taken, week.rows[0].unnecessary, week.rows[0].rejected) == (2, 2, 1)
    assert {item.cluster for item in week.judged} == {lab}


def test_no_cluster_no_figures(now: datetime) -> None:
    result = action_precision([], since=now - timedelta(days=7), until=now)
    assert (result.rows, result.judged, result.judged_total) == ([], [], 0)


def test_the_list_is_newest_first_and_bounded_while_the_figures_count_everything(
    now: datetime,
) -> None:
    cluster = ClusterFactory()
    for minutes in range(5):
        rejected_by(
            restart(cluster, status=RecommendationStatus.AWAITING_APPROVAL),
            "otto",
            now - timedelta(minutes=10 + minutes),
        )
    result = action_precision([cluster], since=now - timedelta(days=1), until=now, listed=3)
    assert result.rows[0].rejected == 5
    assert result.judged_total == 5
    assert [item.at for item in result.judged] == [
        now - timedelta(minutes=10 + minutes) for minutes in range(3)
    ]


def test_the_figures_take_a_bounded_number_of_queries(
    now: datetime, django_assert_max_num_queries: DjangoAssertNumQueries
) -> None:
    """
    GIVEN many clusters, each with many restarts, drains and rejections, some judged
    WHEN their precision is computed
    THEN it takes at most six queries, however many rows there are
    """

    def add_cluster() -> Cluster:
        cluster = ClusterFactory()
        for index in range(6):
            done = carried_out(restart(cluster), now - timedelta(hours=3), step_reached=100)
            progress_resumed(done.workload, 2, 100 if index % 2 else 50, now - timedelta(hours=2))
            drained = carried_out(drain(cluster, f"gpu-{index:03d}"), now - timedelta(hours=3))
            if index % 2:
                resume_requested(drained, "otto", now - timedelta(hours=2, minutes=30))
            rejected_by(
                restart(cluster, status=RecommendationStatus.AWAITING_APPROVAL),
                "otto",
                now - timedelta(hours=1),
            )
        return cluster

    clusters = [add_cluster()]
    with django_assert_max_num_queries(6):
        small = action_precision(clusters, since=now - timedelta(days=7), until=now)
        assert small.judged and small.judged[0].evidence_line == EVIDENCE
    clusters += [add_cluster() for _ in range(4)]
    with django_assert_max_num_queries(6):
        result = action_precision(clusters, since=now - timedelta(days=7), until=now)
        for item in result.judged:  # the listed rows need no further query
            assert item.evidence_line == EVIDENCE
            assert item.recommendation is not None
            assert item.recommendation.workload.job_id
    assert [(row.taken, row.unnecessary, row.rejected) for row in result.rows] == [(12, 6, 6)] * 5
    assert result.judged_total == 5 * 12
