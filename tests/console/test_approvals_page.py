"""The approval queue tells how the crash behind a recommendation was confirmed."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from recovery.choices import AnomalyKind, Confirmation
from tests.conftest import TEST_PASSWORD
from tests.factories import AnomalyFactory, RecommendationFactory

pytestmark = pytest.mark.django_db


def logged_in(user: User) -> Client:
    client = Client()
    assert client.login(username=user.username, password=TEST_PASSWORD)
    return client


def test_a_recommendation_shows_its_crashs_confirmation(viewer: User) -> None:
    """GIVEN a recommendation for a stalled crash and one for a hang
    WHEN a viewer opens the approval queue
    THEN the stalled crash is badged as such, and the hang has no confirmation badge
    """
    stalled = AnomalyFactory(confirmation=Confirmation.STALLED)
    hang = AnomalyFactory(kind=AnomalyKind.HANG)
    RecommendationFactory(workload=stalled.workload, anomaly=stalled)
    RecommendationFactory(workload=hang.workload, anomaly=hang)

    body = logged_in(viewer).get(reverse("console:approvals")).content.decode()

    assert body.count('class="badge confirmation-') == 1
    assert (
        '<span class="badge confirmation-stalled"'
        ' title="Stalled (no exit, no progress: handled as a hang)">Stalled</span>'
    ) in body
