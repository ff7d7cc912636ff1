"""Personal API tokens: issued once, stored hashed, revocable, and kept apart from controllers'."""

from __future__ import annotations

import io
import uuid

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.utils import timezone
from pytest_django.fixtures import Settings as SettingsWrapper
from rest_framework.test import APIClient

from recovery.models import ApiToken, ControllerToken
from recovery.models.controller import hash_token
from tests.conftest import TEST_PASSWORD
from tests.factories import ClusterFactory, RecommendationFactory

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _own_throttle_counters(settings: SettingsWrapper) -> None:
    settings.CACHES = {
        **settings.CACHES,
        "throttle": {**settings.CACHES["throttle"], "KEY_PREFIX": f"test-{uuid.uuid4().hex}"},
    }


def bearer(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


def create_token(username: str, *args: str) -> str:
    out = io.StringIO()
    call_command("create_api_token", username, *args, stdout=out)
    return out.getvalue().strip()


def test_the_command_prints_a_key_once_and_stores_only_its_hash(viewer: User) -> None:
    key = create_token(viewer.username, "--name", "grafana")
    assert key.startswith("wrp_")
    token = ApiToken.objects.get(user=viewer)
    assert token.name == "grafana"
    assert token.key_hash == hash_token(key) and key not in (token.key_hash, token.key_prefix)
    assert token.last_used_at is None


def test_a_token_reads_as_its_user_and_marks_when_it_was_used(viewer: User) -> None:
    ClusterFactory()
    key = create_token(viewer.username)
    response = bearer(key).get("/api/v1/clusters/")
    assert response.status_code == 200
    assert ApiToken.objects.get(user=viewer).last_used_at is not None


def test_an_operator_token_approves(operator: User) -> None:
    recommendation = RecommendationFactory()
    response = bearer(create_token(operator.username)).post(
        f"/api/v1/recommendations/{recommendation.pk}/approve/", {}, format="json"
    )
    assert response.status_code == 200
    assert response.json()["decided_by"] == operator.username


def test_a_viewer_token_cannot_approve(viewer: User) -> None:
    recommendation = RecommendationFactory()
    response = bearer(create_token(viewer.username)).post(
        f"/api/v1/recommendations/{recommendation.pk}/approve/", {}, format="json"
    )
    assert response.status_code == 403


def test_a_revoked_token_is_refused(viewer: User) -> None:
    key = create_token(viewer.username, "--name", "ci")
    out = io.StringIO()
    call_command("create_api_token", viewer.username, "--name", "ci", "--revoke", stdout=out)
    assert "revoked" in out.getvalue()
    response = bearer(key).get("/api/v1/clusters/")
    assert response.status_code == 401
    assert response.json()["error"] == "Unknown or revoked API token."
    assert response.json()["code"] == "authentication_failed"


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ("Bearer wrp_not-a-real-token", "Unknown or revoked"),
        ("Bearer", "Send 'Authorization: Bearer"),
        ("Bearer a b", "Send 'Authorization: Bearer"),
        ("Bearer sometoken", "Not a personal API token"),
    ],
)
def test_a_bad_token_is_a_401_that_says_why(header: str, message: str) -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)
    response = client.get("/api/v1/clusters/")
    assert response.status_code == 401
    assert message in response.json()["error"]


def test_a_disabled_users_token_is_refused(viewer: User) -> None:
    key = create_token(viewer.username)
    User.objects.filter(pk=viewer.pk).update(is_active=False)
    assert bearer(key).get("/api/v1/clusters/").status_code == 401


def test_controller_and_personal_tokens_each_work_only_where_they_belong(viewer: User) -> None:
    """GIVEN a controller token and a person's token, both sent as Bearer
    WHEN each calls the other's API
    THEN each is refused with a message naming where it belongs."""
    _, controller_key = ControllerToken.issue(ClusterFactory(), "advisor-1")
    person_key = create_token(viewer.username)
    assert bearer(controller_key).get("/api/v1/advisor/recommendations/").status_code == 200
    refused = bearer(controller_key).get("/api/v1/clusters/")
    assert refused.status_code == 401
    assert "Advisor API" in refused.json()["error"]
    assert bearer(person_key).get("/api/v1/advisor/recommendations/").status_code == 401


def test_the_command_refuses_unknown_users_and_duplicate_names(viewer: User) -> None:
    with pytest.raises(CommandError, match="no user"):
        create_token("nobody")
    create_token(viewer.username, "--name", "x")
    with pytest.raises(CommandError, match="already has a token"):
        create_token(viewer.username, "--name", "x")


def test_revoking_twice_changes_nothing(viewer: User) -> None:
    token, _ = ApiToken.issue(viewer, "t")
    assert token.revoke() is True
    first = token.revoked_at
    assert token.revoke() is False
    token.refresh_from_db()
    assert token.revoked_at == first and first is not None and first <= timezone.now()


def test_an_admin_creates_a_token_and_sees_the_key_once(site_admin: User) -> None:
    site_admin.is_superuser = True
    site_admin.save()
    client = APIClient()
    client.login(username=site_admin.username, password=TEST_PASSWORD)
    response = client.post(
        "/admin/recovery/apitoken/add/", {"user": site_admin.pk, "name": "dashboards"}, follow=True
    )
    assert response.status_code == 200
    text = response.content.decode()
    key = text.split("shown only this once: ")[1].split("<")[0].strip()
    assert key.startswith("wrp_")
    assert bearer(key).get("/api/v1/clusters/").status_code == 200
    listing = client.get("/admin/recovery/apitoken/").content.decode()
    assert key not in listing
