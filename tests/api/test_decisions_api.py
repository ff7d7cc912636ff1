"""Approve and reject over the API: operators only, once, in the audit trail with their name."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from recovery.choices import AuditKind, RecommendationStatus
from recovery.models import AuditEvent
from tests.factories import RecommendationFactory

pytestmark = pytest.mark.django_db


def client_for(user: User | None) -> APIClient:
    client = APIClient(enforce_csrf_checks=True)
    if user is not None:
        client.force_authenticate(user)
    return client


def url(recommendation_id: int, verb: str) -> str:
    return f"/api/v1/recommendations/{recommendation_id}/{verb}/"


def test_an_operator_approves_once(operator: User) -> None:
    recommendation = RecommendationFactory()
    client = client_for(operator)
    first = client.post(url(recommendation.pk, "approve"), {"note": "go"}, format="json")
    second = client.post(url(recommendation.pk, "approve"), {}, format="json")
    assert first.status_code == second.status_code == 200
    assert first.json()["changed"] is True and first.json()["status"] == "ready"
    assert second.json() == {**first.json(), "changed": False, "message": "Already ready."}
    event = AuditEvent.objects.get(kind=AuditKind.APPROVED)
    assert (event.actor, event.payload["note"]) == (operator.username, "go")


def test_an_operator_rejects_with_a_reason(operator: User) -> None:
    recommendation = RecommendationFactory()
    response = client_for(operator).post(
        url(recommendation.pk, "reject"), {"note": "known flaky job"}, format="json"
    )
    assert response.json()["status"] == RecommendationStatus.REJECTED
    recommendation.refresh_from_db()
    assert recommendation.decision_note == "known flaky job"


@pytest.mark.parametrize("verb", ["approve", "reject"])
def test_viewers_and_strangers_are_refused(viewer: User, verb: str) -> None:
    recommendation = RecommendationFactory()
    assert client_for(viewer).post(url(recommendation.pk, verb)).status_code == 403
    assert client_for(None).post(url(recommendation.pk, verb)).status_code == 403
    recommendation.refresh_from_db()
    assert recommendation.status == RecommendationStatus.AWAITING_APPROVAL
    assert not AuditEvent.objects.exists()


def test_bad_input_gets_a_clear_error(operator: User) -> None:
    client = client_for(operator)
    assert client.post(url(999999, "approve")).status_code == 404
    recommendation = RecommendationFactory()
    response = client.post(url(recommendation.pk, "approve"), {"note": "x" * 2001}, format="json")
    assert response.status_code == 400
    assert "note" in response.json()["fields"]
    recommendation.refresh_from_db()
    assert recommendation.status == RecommendationStatus.AWAITING_APPROVAL
