"""Recommendation status changes are conditional: races and repeats act once."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from recovery.choices import AuditKind, ClusterMode, RecommendationAction, RecommendationStatus
from recovery.loop import recommendations
from recovery.models import AuditEvent, Cluster, Node, Recommendation
from recovery.models.recommendation import InvalidTransition
from tests.factories import ClusterFactory, RecommendationFactory, WorkloadFactory

pytestmark = pytest.mark.django_db


def test_it_refuses_a_transition_the_table_forbids() -> None:
    recommendation = RecommendationFactory(status=RecommendationStatus.EXECUTED)
    with pytest.raises(InvalidTransition):
        recommendation.transition(RecommendationStatus.READY)


def test_it_refuses_a_transition_when_another_process_moved_first() -> None:
    recommendation = RecommendationFactory(status=RecommendationStatus.READY)
    stale_copy = type(recommendation).objects.get(pk=recommendation.pk)
    recommendation.transition(RecommendationStatus.CLAIMED, lease_owner="controller-a")
    with pytest.raises(InvalidTransition):
        stale_copy.transition(RecommendationStatus.CLAIMED, lease_owner="controller-b")
    assert stale_copy.lease_owner == "controller-a"


def test_only_one_controller_claims() -> None:
    recommendation = RecommendationFactory(status=RecommendationStatus.READY)
    recommendations.claim(recommendation.pk, controller="slurm-advisor-1", lease_seconds=60)
    with pytest.raises(InvalidTransition):
        recommendations.claim(recommendation.pk, controller="slurm-advisor-2", lease_seconds=60)
    assert AuditEvent.objects.get().actor == "slurm-advisor-1"


def test_approving_a_recommendation_that_is_not_waiting_changes_nothing() -> None:
    recommendation = RecommendationFactory(status=RecommendationStatus.SUPERSEDED)
    outcome = recommendations.approve(recommendation.pk, operator="otto")
    assert not outcome.changed
    assert "Not awaiting approval" in outcome.message
    assert not AuditEvent.objects.exists()


def test_it_releases_expired_leases_and_records_it() -> None:
    """
    GIVEN a recommendation claimed by a controller whose lease ran out
    WHEN the sweep runs twice
    THEN it is ready again, with one lease_expired event naming the silent controller
    """
    expired = RecommendationFactory(
        status=RecommendationStatus.CLAIMED,
        lease_owner="slurm-advisor-1",
        lease_expires_at=timezone.now() - timedelta(seconds=1),
    )
    current = RecommendationFactory(
        status=RecommendationStatus.CLAIMED,
        lease_owner="slurm-advisor-2",
        lease_expires_at=timezone.now() + timedelta(minutes=5),
    )
    assert recommendations.release_expired_leases() == 1
    assert recommendations.release_expired_leases() == 0
    expired.refresh_from_db()
    current.refresh_from_db()
    assert expired.status == RecommendationStatus.READY
    assert expired.lease_owner == ""
    assert current.status == RecommendationStatus.CLAIMED
    event = AuditEvent.objects.get(kind=AuditKind.LEASE_EXPIRED)
    assert event.payload == {"recommendation": expired.pk, "previous_owner": "slurm-advisor-1"}


def policy_ready(cluster: Cluster, **fields: object) -> Recommendation:
    """A recommendation the policy made ready on its own, as in an acting cluster."""
    return RecommendationFactory(
        workload=WorkloadFactory(cluster=cluster),
        status=RecommendationStatus.READY,
        approved_by="",
        **fields,
    )


def test_what_the_policy_made_ready_stops_when_the_cluster_goes_back_to_monitor_mode() -> None:
    """
    GIVEN a restart the policy made ready on an acting cluster, and an operator-approved one
    WHEN the cluster is switched back to monitor mode before a controller claims them
    THEN the policy's is neither listed nor claimable; the approved one still is
    """
    cluster = ClusterFactory(mode=ClusterMode.ACTION, acknowledge_scheduler_actions=True)
    by_policy = policy_ready(cluster)
    approved = RecommendationFactory(
        workload=WorkloadFactory(cluster=cluster), status=RecommendationStatus.READY
    )
    assert list(recommendations.claimable_for(cluster)) == [by_policy, approved]

    cluster.mode = ClusterMode.MONITOR
    cluster.save()

    assert list(recommendations.claimable_for(cluster)) == [approved]
    with pytest.raises(InvalidTransition):
        recommendations.claim(by_policy.pk, controller="slurm-advisor-1", lease_seconds=60)
    recommendations.claim(approved.pk, controller="slurm-advisor-1", lease_seconds=60)


def test_turning_the_acknowledgement_off_stops_it_too_even_after_a_lease_ran_out() -> None:
    cluster = ClusterFactory(mode=ClusterMode.ACTION, acknowledge_scheduler_actions=True)
    taken = policy_ready(cluster)
    recommendations.claim(taken.pk, controller="slurm-advisor-1", lease_seconds=60)
    Recommendation.objects.filter(pk=taken.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert list(recommendations.claimable_for(cluster)) == [taken]

    cluster.acknowledge_scheduler_actions = False
    cluster.save()

    assert list(recommendations.claimable_for(cluster)) == []
    with pytest.raises(InvalidTransition):
        recommendations.claim(taken.pk, controller="slurm-advisor-2", lease_seconds=60)


def test_a_drain_the_policy_made_ready_needs_automatic_drains_still_on() -> None:
    cluster = ClusterFactory(
        mode=ClusterMode.ACTION, acknowledge_scheduler_actions=True, drain_automatically=True
    )
    node = Node.objects.create(cluster=cluster, name="gpu-002")
    drain = policy_ready(cluster, action=RecommendationAction.DRAIN, node=node)
    assert list(recommendations.claimable_for(cluster)) == [drain]

    cluster.drain_automatically = False
    cluster.save()

    assert list(recommendations.claimable_for(cluster)) == []
