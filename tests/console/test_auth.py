"""Login, and the roles: viewers see, operators decide, anonymous users are sent to log in."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from recovery.choices import AuditKind, RecommendationStatus
from recovery.models import AuditEvent, Recommendation
from tests.conftest import TEST_PASSWORD
from tests.factories import AnomalyFactory, RecommendationFactory, WorkloadFactory

pytestmark = pytest.mark.django_db


def logged_in(user: User) -> Client:
    client = Client()
    assert client.login(username=user.username, password=TEST_PASSWORD)
    return client


def test_the_login_page_renders() -> None:
    response = Client().get(reverse("login"))
    body = response.content.decode()
    assert response.status_code == 200
    assert 'name="username"' in body
    assert 'name="password"' in body
    assert "console/console.css" in body


def test_it_logs_in_and_lands_on_the_fleet(operator: User) -> None:
    client = Client()
    response = client.post(
        reverse("login"), {"username": operator.username, "password": TEST_PASSWORD}
    )
    assert response.status_code == 302
    assert response["Location"] == reverse("console:fleet")
    assert client.get(reverse("console:fleet")).status_code == 200


def test_it_refuses_a_wrong_password(operator: User) -> None:
    response = Client().post(reverse("login"), {"username": operator.username, "password": "no"})
    assert response.status_code == 200
    assert "enter a correct username and password" in response.content.decode()


@pytest.mark.parametrize("name", ["console:fleet", "console:approvals"])
def test_anonymous_users_are_sent_to_log_in(name: str) -> None:
    response = Client().get(reverse(name))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_the_fleet_lists_workloads(viewer: User) -> None:
    workload = WorkloadFactory(name="llama-70b-pretrain", job_id="48213")
    body = logged_in(viewer).get(reverse("console:fleet")).content.decode()
    assert "llama-70b-pretrain" in body
    assert "48213" in body
    assert reverse("console:workload", args=[workload.pk]) in body


def test_the_fleet_shows_labels_and_links_the_pending_decision(viewer: User) -> None:
    recommendation = RecommendationFactory()
    AnomalyFactory(workload=recommendation.workload)
    body = logged_in(viewer).get(reverse("console:fleet")).content.decode()
    assert "GPU hardware" in body
    assert "Restart excluding nodes" in body
    assert "awaiting approval" in body
    assert f"#recommendation-{recommendation.pk}" in body


def test_the_fleet_filters_by_search(viewer: User) -> None:
    WorkloadFactory(name="llama-70b-pretrain")
    WorkloadFactory(name="mixtral-sft")
    body = logged_in(viewer).get(reverse("console:fleet"), {"q": "mixtral"}).content.decode()
    assert "mixtral-sft" in body
    assert "llama-70b-pretrain" not in body


def test_the_workload_page_renders(viewer: User) -> None:
    recommendation = RecommendationFactory()
    response = logged_in(viewer).get(reverse("console:workload", args=[recommendation.workload.pk]))
    assert response.status_code == 200
    assert recommendation.reason in response.content.decode()


def test_a_viewer_sees_approvals_without_buttons(viewer: User) -> None:
    recommendation = RecommendationFactory()
    body = logged_in(viewer).get(reverse("console:approvals")).content.decode()
    assert recommendation.reason in body
    assert reverse("console:approve", args=[recommendation.pk]) not in body


def test_an_operator_sees_approval_buttons(operator: User) -> None:
    recommendation = RecommendationFactory()
    body = logged_in(operator).get(reverse("console:approvals")).content.decode()
    assert reverse("console:approve", args=[recommendation.pk]) in body
    assert reverse("console:reject", args=[recommendation.pk]) in body


@pytest.mark.parametrize("decision", ["console:approve", "console:reject"])
def test_a_viewer_is_refused_a_decision(viewer: User, decision: str) -> None:
    recommendation = RecommendationFactory()
    response = logged_in(viewer).post(reverse(decision, args=[recommendation.pk]))
    assert response.status_code == 403
    recommendation.refresh_from_db()
    assert recommendation.status == RecommendationStatus.AWAITING_APPROVAL
    assert not AuditEvent.objects.exists()


def test_a_user_without_a_role_is_refused_a_decision(outsider: User) -> None:
    recommendation = RecommendationFactory()
    response = logged_in(outsider).post(reverse("console:approve", args=[recommendation.pk]))
    assert response.status_code == 403


def test_an_anonymous_decision_is_sent_to_log_in() -> None:
    recommendation = RecommendationFactory()
    response = Client().post(reverse("console:approve", args=[recommendation.pk]))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))
    assert "next=/approvals/" in response["Location"]
    assert Recommendation.objects.get().status == RecommendationStatus.AWAITING_APPROVAL


def test_an_operator_approves_once_on_a_double_click(operator: User) -> None:
    recommendation = RecommendationFactory()
    client = logged_in(operator)
    url = reverse("console:approve", args=[recommendation.pk])
    assert client.post(url, {"note": "bad GPU, go"}).status_code == 302
    assert client.post(url, {"note": "bad GPU, go"}).status_code == 302
    recommendation.refresh_from_db()
    assert recommendation.status == RecommendationStatus.READY
    assert recommendation.decided_by == operator.username
    events = AuditEvent.objects.filter(kind=AuditKind.APPROVED)
    assert events.count() == 1
    assert events.get().actor == operator.username
    assert events.get().payload["note"] == "bad GPU, go"


def test_an_operator_rejects_with_a_reason(operator: User) -> None:
    recommendation = RecommendationFactory()
    client = logged_in(operator)
    client.post(reverse("console:reject", args=[recommendation.pk]), {"note": "known flake"})
    recommendation.refresh_from_db()
    assert recommendation.status == RecommendationStatus.REJECTED
    assert recommendation.decision_note == "known flake"
    assert AuditEvent.objects.get().kind == AuditKind.REJECTED


def test_a_decision_does_not_redirect_off_site(operator: User) -> None:
    recommendation = RecommendationFactory()
    response = logged_in(operator).post(
        reverse("console:approve", args=[recommendation.pk]), {"next": "https://evil.example/"}
    )
    assert response["Location"] == reverse("console:approvals")


def test_deciding_an_unknown_recommendation_is_404(operator: User) -> None:
    assert logged_in(operator).post(reverse("console:approve", args=[999999])).status_code == 404


def test_the_approval_queue_filters_by_cluster(viewer: User) -> None:
    kept = RecommendationFactory(workload=WorkloadFactory(cluster__name="east", job_id="701"))
    RecommendationFactory(workload=WorkloadFactory(cluster__name="west", job_id="702"))
    body = logged_in(viewer).get(reverse("console:approvals"), {"cluster": "east"}).content.decode()
    assert f'id="recommendation-{kept.pk}"' in body
    assert ":702" not in body


def test_an_unknown_cluster_in_the_queue_filter_is_ignored_with_the_reason(viewer: User) -> None:
    RecommendationFactory(workload=WorkloadFactory(job_id="703"))
    body = logged_in(viewer).get(reverse("console:approvals"), {"cluster": "nope"}).content.decode()
    assert "No cluster is called" in body
    assert ":703" in body


@pytest.mark.parametrize("page", ["fleet", "workload", "workload_timeline", "approvals"])
def test_a_signed_in_user_without_a_role_is_refused_the_pages(outsider: User, page: str) -> None:
    workload = WorkloadFactory()
    args = [workload.pk] if page.startswith("workload") else []
    response = logged_in(outsider).get(reverse(f"console:{page}", args=args))
    assert response.status_code == 403
    assert "needs a Console role" in response.content.decode()
