"""Recommendation status changes are conditional: races and repeats act once."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from recovery.choices import AuditKind, RecommendationStatus
from recovery.loop import recommendations
from recovery.models import AuditEvent
from recovery.models.recommendation import InvalidTransition
from tests.factories import RecommendationFactory

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
