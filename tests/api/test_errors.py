"""Every API error is the same JSON, with a clear message and never a stack trace."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponse
from django.test import Client
from django.urls import path
from pytest_django.fixtures import Settings as SettingsWrapper
from rest_framework.test import APIClient

from recovery.models import ControllerToken
from recovery.read.filters import ClusterFilterSet
from tests.factories import ClusterFactory
from workload_recovery.urls import urlpatterns as project_urlpatterns

pytestmark = pytest.mark.django_db

SECRET = "password=hunter2 in /etc/workload-recovery"


def _django_boom(request: HttpRequest) -> HttpResponse:
    raise RuntimeError(SECRET)


# A URLconf with the handlers workload_recovery/urls.py should name (see test_django_*).
urlpatterns = [
    path("api/v1/django-boom/", _django_boom),
    path("page/boom/", _django_boom),
    *project_urlpatterns,
]
handler404 = "api.errors.not_found"
handler500 = "api.errors.server_error"


@pytest.fixture(autouse=True)
def _own_throttle_counters(settings: SettingsWrapper) -> None:
    settings.CACHES = {
        **settings.CACHES,
        "throttle": {**settings.CACHES["throttle"], "KEY_PREFIX": f"test-{uuid.uuid4().hex}"},
    }


def as_user(user: User | None) -> APIClient:
    client = APIClient()
    if user is not None:
        client.force_authenticate(user)
    return client


def assert_error(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status
    assert response["Content-Type"] == "application/json"
    body: dict[str, Any] = response.json()
    assert body["code"] == code
    assert isinstance(body["error"], str) and body["error"]
    assert body["detail"] == body["error"]
    return body


def test_400_names_each_field(viewer: User) -> None:
    body = assert_error(
        as_user(viewer).get("/api/v1/clusters/", {"mode": "x"}), 400, "invalid_choice"
    )
    assert body["fields"] == {"mode": ['"x" is not a valid choice.']}


def test_401_for_anonymous_callers() -> None:
    assert_error(APIClient().get("/api/v1/clusters/"), 401, "not_authenticated")


def test_403_for_people_without_a_role(outsider: User) -> None:
    assert_error(as_user(outsider).get("/api/v1/clusters/"), 403, "permission_denied")


def test_404_for_an_unknown_id(viewer: User) -> None:
    assert_error(as_user(viewer).get("/api/v1/workloads/424242/"), 404, "not_found")


def test_405_for_a_method_the_resource_does_not_allow(viewer: User) -> None:
    body = assert_error(
        as_user(viewer).put("/api/v1/clusters/", {}, format="json"), 405, "method_not_allowed"
    )
    assert "PUT" in body["error"]


def test_429_says_when_to_retry(viewer: User, settings: SettingsWrapper) -> None:
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {"user": "2/minute", "controller": "2/minute"},
    }
    client = as_user(viewer)
    assert [client.get("/api/v1/clusters/").status_code for _ in range(2)] == [200, 200]
    response = client.get("/api/v1/clusters/")
    body = assert_error(response, 429, "throttled")
    assert 0 < int(response["Retry-After"]) <= 60
    assert body["retry_after"] == int(response["Retry-After"])


def test_sessions_and_tokens_share_a_persons_budget_but_not_another_persons(
    viewer: User, operator: User, settings: SettingsWrapper
) -> None:
    from recovery.models import ApiToken

    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {"user": "1/minute", "controller": "1/minute"},
    }
    _, key = ApiToken.issue(viewer, "t")
    token_client = APIClient()
    token_client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    assert as_user(viewer).get("/api/v1/clusters/").status_code == 200
    assert token_client.get("/api/v1/clusters/").status_code == 429
    assert as_user(operator).get("/api/v1/clusters/").status_code == 200


def test_controllers_are_throttled_by_token(settings: SettingsWrapper) -> None:
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {"user": "1/minute", "controller": "1/minute"},
    }
    _, key = ControllerToken.issue(ClusterFactory(), "advisor-1")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    assert client.get("/api/v1/advisor/recommendations/").status_code == 200
    assert_error(client.get("/api/v1/advisor/recommendations/"), 429, "throttled")


def test_an_unreachable_throttle_cache_lets_requests_through(
    viewer: User, settings: SettingsWrapper, caplog: pytest.LogCaptureFixture
) -> None:
    settings.CACHES = {
        **settings.CACHES,
        "throttle": {**settings.CACHES["throttle"], "LOCATION": "redis://127.0.0.1:1/0"},
    }
    with caplog.at_level(logging.WARNING, logger="api.resources.throttling"):
        assert as_user(viewer).get("/api/v1/clusters/").status_code == 200
    assert "Throttle cache unavailable" in caplog.text


def test_500_is_generic_json_and_logged(
    viewer: User, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """GIVEN a resource whose code fails unexpectedly
    WHEN a viewer lists it
    THEN the answer is a generic JSON 500 without the exception, and the log has the trace."""

    def broken(*args: Any) -> Any:
        raise RuntimeError(SECRET)

    monkeypatch.setattr(ClusterFilterSet, "filter_queryset", broken)
    with caplog.at_level(logging.ERROR, logger="api.errors"):
        response = as_user(viewer).get("/api/v1/clusters/")
    body = assert_error(response, 500, "server_error")
    text = response.content.decode()
    assert SECRET not in text and "Traceback" not in text and "RuntimeError" not in text
    assert "logged" in body["error"]
    assert SECRET in caplog.text


def test_a_database_that_cannot_answer_is_a_503_to_retry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by the chaos run: while MariaDB restarted, every Advisor API call was a 500 with
    the server-error message, which reads like a bug; it is the database being away.

    GIVEN a controller calling while the database refuses connections
    THEN the answer is a JSON 503 with Retry-After, saying nothing was changed."""
    from django.db import OperationalError

    from recovery.loop import recommendations

    cluster = ClusterFactory()
    _, key = ControllerToken.issue(cluster, "ctl")

    def refused(*args: Any) -> Any:
        raise OperationalError(2002, "Can't connect to server on '127.0.0.1' (115)")

    monkeypatch.setattr(recommendations, "claimable_for", refused)
    response = APIClient().get(
        "/api/v1/advisor/recommendations/", HTTP_AUTHORIZATION=f"Bearer {key}"
    )
    body = assert_error(response, 503, "unavailable")
    assert response["Retry-After"] == "5"
    assert "nothing was changed" in body["error"]
    assert "127.0.0.1" not in response.content.decode()


@pytest.mark.urls(__name__)
def test_django_404_under_api_is_json_and_elsewhere_a_page() -> None:
    assert_error(Client().get("/api/v1/no-such-thing/"), 404, "not_found")
    page = Client().get("/no-such-page/")
    assert page.status_code == 404
    assert "application/json" not in page["Content-Type"]


@pytest.mark.urls(__name__)
def test_django_500_under_api_is_json_without_a_trace() -> None:
    client = Client(raise_request_exception=False)
    response = client.get("/api/v1/django-boom/")
    assert_error(response, 500, "server_error")
    assert SECRET not in response.content.decode()
    page = client.get("/page/boom/")
    assert page.status_code == 500
    assert "application/json" not in page["Content-Type"]
