"""Recommendation status changes are conditional: races and repeats act once."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from recovery.choices import AuditKind, ClusterMode, RecommendationAction, RecommendationStatus
from recovery.loop import leases, recommendations
from recovery.models import AuditEvent, Cluster, Node, Recommendation
from recovery.models.recommendation import InvalidTransition
from tests.factories import ClusterFactory, RecommendationFactory, WorkloadFactory

pytestmark = pytest.mark.django_db

# Two controller processes, as the instance ids each makes at start.
FIRST = "0f6c2b8e-1d3a-4b5c-8e7f-9a0b1c2d3e4f"
SECOND = "7a8b9c0d-1e2f-4a3b-8c4d-5e6f7a8b9c0d"


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
    recommendations.claim(
        recommendation.pk, controller="slurm-advisor-1", instance=FIRST, lease_seconds=60
    )
    with pytest.raises(InvalidTransition):
        recommendations.claim(
            recommendation.pk, controller="slurm-advisor-2", instance=SECOND, lease_seconds=60
        )
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
        lease_instance=FIRST,
        lease_expires_at=timezone.now() - timedelta(seconds=1),
    )
    current = RecommendationFactory(
        status=RecommendationStatus.CLAIMED,
        lease_owner="slurm-advisor-2",
        lease_expires_at=timezone.now() + timedelta(minutes=5),
    )
    assert leases.release_expired_leases() == 1
    assert leases.release_expired_leases() == 0
    expired.refresh_from_db()
    current.refresh_from_db()
    assert expired.status == RecommendationStatus.READY
    assert (expired.lease_owner, expired.lease_instance) == ("", "")
    assert current.status == RecommendationStatus.CLAIMED
    event = AuditEvent.objects.get(kind=AuditKind.LEASE_EXPIRED)
    assert event.payload == {
        "recommendation": expired.pk,
        "previous_owner": "slurm-advisor-1",
        "previous_instance": FIRST,
    }


EXECUTED = recommendations.ActionReport(
    outcome=RecommendationStatus.EXECUTED,
    state_before={"job_state": "RUNNING"},
    commands=[{"argv": ["scontrol", "requeuehold", "4242"], "returncode": 0}],
    converged=True,
)


def test_a_lease_is_held_by_the_controller_process_not_by_its_token() -> None:
    """
    GIVEN two processes of the controller slurm-advisor-1 (one token), the first holding a lease
    WHEN the second renews, dispatches, reports or claims it
    THEN each is refused and nothing changes but the audited refusal of the report; the
         trail names the token's actor and, in its payload, the process
    """
    recommendation = RecommendationFactory(status=RecommendationStatus.READY)
    held = recommendations.claim(
        recommendation.pk, controller="controller:a1", instance=FIRST, lease_seconds=60
    )
    assert held.lease_instance == FIRST
    claimed = AuditEvent.objects.get(kind=AuditKind.CLAIMED)
    assert claimed.actor == "controller:a1"
    assert claimed.payload["controller_instance"] == FIRST

    with pytest.raises(InvalidTransition, match="another process with the same token"):
        leases.renew_lease(
            recommendation.pk, controller="controller:a1", instance=SECOND, lease_seconds=600
        )
    with pytest.raises(InvalidTransition, match=f"instance {FIRST}"):
        leases.record_dispatch(
            recommendation.pk,
            controller="controller:a1",
            instance=SECOND,
            argv=["scontrol", "requeuehold", "4242"],
            sequence=1,
        )
    with pytest.raises(InvalidTransition):
        recommendations.report(
            recommendation.pk, controller="controller:a1", instance=SECOND, result=EXECUTED
        )
    with pytest.raises(InvalidTransition):
        recommendations.claim(
            recommendation.pk, controller="controller:a1", instance=SECOND, lease_seconds=60
        )
    now = Recommendation.objects.get(pk=recommendation.pk)
    assert (now.status, now.lease_instance, now.lease_expires_at) == (
        RecommendationStatus.CLAIMED,
        FIRST,
        held.lease_expires_at,
    )
    assert not AuditEvent.objects.filter(kind=AuditKind.DISPATCHED).exists()
    refused = AuditEvent.objects.get(kind=AuditKind.REPORT_REFUSED)
    assert (refused.actor, refused.payload["controller_instance"]) == ("controller:a1", SECOND)

    # The holder itself goes on, and its report names it.
    event = leases.record_dispatch(
        recommendation.pk,
        controller="controller:a1",
        instance=FIRST,
        argv=["scontrol", "requeuehold", "4242"],
        sequence=1,
    )
    assert event.payload["controller_instance"] == FIRST
    recommendations.report(
        recommendation.pk, controller="controller:a1", instance=FIRST, result=EXECUTED
    )
    done = AuditEvent.objects.get(kind=AuditKind.SCHEDULER_ACTION)
    assert done.payload["controller_instance"] == FIRST


def test_a_restarted_controller_waits_for_its_old_lease_to_lapse() -> None:
    recommendation = RecommendationFactory(status=RecommendationStatus.READY)
    recommendations.claim(
        recommendation.pk, controller="controller:a1", instance=FIRST, lease_seconds=60
    )
    with pytest.raises(InvalidTransition, match="claimed, held by controller:a1"):
        recommendations.claim(
            recommendation.pk, controller="controller:a1", instance=SECOND, lease_seconds=60
        )
    Recommendation.objects.filter(pk=recommendation.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    recommendations.claim(
        recommendation.pk, controller="controller:a1", instance=SECOND, lease_seconds=60
    )
    latest = AuditEvent.objects.filter(kind=AuditKind.CLAIMED).latest("id")
    assert (latest.payload["previous_owner"], latest.payload["previous_instance"]) == (
        "controller:a1",
        FIRST,
    )


def test_a_lease_without_a_controller_instance_is_refused() -> None:
    recommendation = RecommendationFactory(status=RecommendationStatus.READY)
    with pytest.raises(ValueError, match="instance"):
        recommendations.claim(
            recommendation.pk, controller="controller:a1", instance="", lease_seconds=60
        )
    recommendation.refresh_from_db()
    assert recommendation.status == RecommendationStatus.READY
    assert not AuditEvent.objects.exists()


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
        recommendations.claim(
            by_policy.pk, controller="slurm-advisor-1", instance=FIRST, lease_seconds=60
        )
    recommendations.claim(
        approved.pk, controller="slurm-advisor-1", instance=FIRST, lease_seconds=60
    )


def test_turning_the_acknowledgement_off_stops_it_too_even_after_a_lease_ran_out() -> None:
    cluster = ClusterFactory(mode=ClusterMode.ACTION, acknowledge_scheduler_actions=True)
    taken = policy_ready(cluster)
    recommendations.claim(taken.pk, controller="slurm-advisor-1", instance=FIRST, lease_seconds=60)
    Recommendation.objects.filter(pk=taken.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert list(recommendations.claimable_for(cluster)) == [taken]

    cluster.acknowledge_scheduler_actions = False
    cluster.save()

    assert list(recommendations.claimable_for(cluster)) == []
    with pytest.raises(InvalidTransition):
        recommendations.claim(
            taken.pk, controller="slurm-advisor-2", instance=SECOND, lease_seconds=60
        )


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
