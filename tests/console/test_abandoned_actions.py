"""An abandoned action raises a banner on every page until an operator acknowledges it."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from recovery.choices import Disposition, RecommendationStatus
from recovery.models import Recommendation
from tests.conftest import TEST_PASSWORD
from tests.factories import RecommendationFactory

pytestmark = pytest.mark.django_db

BANNER = "abandoned: the scheduler did not reach the state recovery wanted"


def logged_in(user: User) -> Client:
    client = Client()
    assert client.login(username=user.username, password=TEST_PASSWORD)
    return client


def abandoned() -> Recommendation:
    return RecommendationFactory(
        status=RecommendationStatus.EXECUTED,
        disposition=Disposition.ABANDONED,
        disposition_reason="abandoned: the job is FAILED and Slurm will not requeue it",
    )


def test_the_banner_stays_until_an_operator_acknowledges(operator: User, viewer: User) -> None:
    """
    GIVEN a restart the controller reported as not reaching the wanted state
    WHEN a viewer and an operator browse the Console, and the viewer tries to acknowledge it
    THEN both see the banner and the reason; only the operator's acknowledgement removes it
    """
    action = abandoned()
    as_viewer, as_operator = logged_in(viewer), logged_in(operator)
    for client in (as_viewer, as_operator):
        page = client.get(reverse("console:fleet")).content.decode()
        assert f"1 action {BANNER}" in page
    queue = as_viewer.get(reverse("console:approvals")).content.decode()
    assert "Slurm will not requeue it" in queue and 'id="abandoned"' in queue
    page = as_viewer.get(reverse("console:workload", args=[action.workload_id])).content.decode()
    assert f'data-testid="disposition-{action.pk}"' in page

    url = reverse("console:acknowledge", args=[action.pk])
    assert as_viewer.post(url).status_code == 403
    assert BANNER in as_viewer.get(reverse("console:fleet")).content.decode()

    answer = as_operator.post(url, {"next": reverse("console:fleet")})
    assert answer.status_code == 302
    assert BANNER not in as_operator.get(reverse("console:fleet")).content.decode()
    action.refresh_from_db()
    assert action.acknowledged_by


def test_nobody_signed_out_sees_the_banner(client: Client) -> None:
    abandoned()
    assert BANNER not in client.get(reverse("login")).content.decode()
